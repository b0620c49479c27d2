"""Two CPU processes (gloo on 127.0.0.1) measure what one process measures.

Each process is ``python -m jaxroll measure ...`` with the environment
torchrun gives its workers (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``); rank 0 merges the partial sums and writes
the outputs. The oracle is a single-process run of the same command on the
same float64 model. Sums are added in another order, so the tolerance is
1e-12 relative (float64 reassociation gives a few 1e-16).
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers  # noqa: E402
from tiny_tokenizer import WORDS, word_level_tokenizer  # noqa: E402

from jaxroll.cli import main  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(argv, world, port):
    processes = []
    for rank in range(world):
        environment = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                           LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                           OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        processes.append(subprocess.Popen([sys.executable, "-m", "jaxroll", *map(str, argv)], env=environment,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for process in processes:
        try:
            stdout, stderr = process.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise
        results.append((process.returncode, stdout, stderr))
    return results


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bloom")
    torch.manual_seed(0)
    config = transformers.BloomConfig(n_layer=2, n_head=4, hidden_size=32, vocab_size=64)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    word_level_tokenizer().save_pretrained(directory)
    rng = np.random.default_rng(0)
    texts = directory / "docs.txt"
    texts.write_text("\n\n".join(" ".join(rng.choice(WORDS, size=14)) for _ in range(5)) + "\n", encoding="utf-8")
    return directory, texts


def test_two_processes_equal_one(saved, tmp_path, capsys):
    directory, texts = saved
    arguments = ["measure", directory, "--texts", texts, "--length", 12, "--samples", 5, "--dtype", "float64",
                 "--stats", "lambda,content,influence,attention,sinks", "--quiet"]
    single = tmp_path / "single"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank (OMP_NUM_THREADS=1): the same per-sequence arithmetic
    try:
        assert main([str(item) for item in [*arguments, "--out", single]]) == 0, capsys.readouterr().err
    finally:
        torch.set_num_threads(threads)
    double = tmp_path / "double"
    results = launch([*arguments, "--out", double], world=2, port=free_port())
    for code, stdout, stderr in results:
        assert code == 0, stderr
    assert "jaxroll measure" in results[0][1] and results[1][1] == ""  # rank 0 alone reports and writes
    assert sorted(path.name for path in double.iterdir()) == sorted(path.name for path in single.iterdir())
    with np.load(single / "measurement.npz") as one, np.load(double / "measurement.npz") as two:
        assert sorted(one.files) == sorted(two.files)
        for name in one.files:
            np.testing.assert_allclose(two[name], one[name], rtol=1e-12, atol=1e-15, err_msg=name)
    metadata = json.loads((double / "metadata.json").read_text())
    assert metadata["processes"] == 2 and metadata["timing"]["sequences_per_process"] == [3, 2]


def test_a_refusal_stops_every_rank_and_each_rank_resumes_its_own_file(saved, tmp_path, monkeypatch, capsys):
    directory, texts = saved
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep", encoding="utf-8")
    arguments = ["measure", directory, "--texts", texts, "--length", 12, "--samples", 4, "--quiet"]
    results = launch([*arguments, "--out", busy], world=2, port=free_port())
    for code, _, stderr in results:  # rank 0 refuses --out; rank 1 stops with the same line
        assert code == 2 and "not empty" in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert sorted(path.name for path in busy.iterdir()) == ["mine.txt"]
    # --resume looks for this rank's own file (checked before the process group is joined).
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert main([str(item) for item in [*arguments, "--out", busy, "--resume"]]) == 2
    assert "no checkpoint.rank1-of-2.npz" in capsys.readouterr().err

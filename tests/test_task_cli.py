"""`jaxroll task` and `jaxroll compare-task` end to end on tiny saved models of every family `measure` supports.

Oracles: the rows of cases.jsonl are rescored by a plain torch forward
pass of the saved model (the file alone is enough to rescore); a two-process
run (gloo on 127.0.0.1) writes the same rows as one process; bad input
exits 2 and creates nothing.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers  # noqa: E402
from test_task import VOCAB, task_tokenizer  # noqa: E402

from jaxroll.cli import main  # noqa: E402
from tiny_tokenizer import run_cli as _run  # noqa: E402
from jaxroll.task import grid  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = ("bloom", "mpt", "falcon", "gpt2", "llama")


def _config(family):
    if family == "bloom":
        return transformers.BloomConfig(n_layer=2, n_head=4, hidden_size=32, vocab_size=VOCAB)
    if family == "mpt":
        return transformers.MptConfig(n_layers=2, n_heads=4, d_model=32, vocab_size=VOCAB, max_seq_len=96)
    if family == "falcon":
        return transformers.FalconConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, vocab_size=VOCAB,
                                         alibi=True, parallel_attn=False, new_decoder_architecture=False,
                                         multi_query=False, bias=True)
    if family == "gpt2":
        return transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=VOCAB, n_positions=128,
                                       bos_token_id=0, eos_token_id=0)
    return transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
                                    intermediate_size=64, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tokenizer = task_tokenizer()
    directories = {}
    for family in FAMILIES:
        torch.manual_seed(0)
        directory = tmp_path_factory.mktemp(family)
        transformers.AutoModelForCausalLM.from_config(_config(family)).save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        directories[family] = directory
    return directories


GRID = ["--lengths", "66,72", "--depths", "0,0.5,1", "--samples", 2, "--quiet"]


def rescore(model_dir, row):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    ids = torch.tensor([row["prompt_ids"] + row["answer_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0].double()
    start = len(row["prompt_ids"]) - 1
    rows = logits[start: start + len(row["answer_ids"])]
    gold = torch.tensor(row["answer_ids"])
    logprob = float((rows.log_softmax(-1).gather(-1, gold[:, None])).sum())
    return logprob, bool((rows.argmax(-1) == gold).all())


@pytest.mark.parametrize("family", FAMILIES)
def test_task_and_compare_task_end_to_end(family, saved, tmp_path, capsys):
    out = tmp_path / "task"
    code, stdout, stderr = _run(["task", saved[family], "--out", out, *GRID, "--dtype", "float64"], capsys)
    assert code == 0, stderr
    for name in ("cases.jsonl", "task.json", "summary.csv", "summary.json", "kv.png", "passkey.png", "copy.png"):
        assert (out / name).is_file(), name
    rows = grid.read_rows(out / "cases.jsonl")
    assert len(rows) == 3 * 2 * 3 * 2
    for field in ("task", "length", "depth", "prompt_ids", "answer_ids", "logprob", "exact"):
        assert all(field in row for row in rows), field
    logprob, exact = rescore(saved[family], rows[-1])  # anyone can rescore a case from the file alone
    assert rows[-1]["logprob"] == pytest.approx(logprob, abs=1e-9) and rows[-1]["exact"] == exact
    report = json.loads((out / "summary.json").read_text())
    assert set(report["tasks"]) == {"kv", "passkey", "copy"}
    assert "effective length" in stdout
    code, printed, stderr = _run(["task", saved[family], "--out", out, *GRID, "--dtype", "float64", "--resume",
                                  "--json"], capsys)  # every case scored: the summary again, as one object
    assert code == 0, stderr
    assert {key: value for key, value in json.loads(printed).items() if key not in ("cases", "out")} == report
    compare = tmp_path / "compare"
    code, stdout, stderr = _run(["compare-task", out, "--task", "copy", "--length", 72, "--preset", "mpt-7b",
                                 "--score", "logprob", "--out", compare], capsys)
    assert code == 0, stderr
    for name in ("compare.csv", "compare.json", "compare.txt", "compare.png"):
        assert (compare / name).is_file(), name
    result = json.loads((compare / "compare.json").read_text())
    assert result["length"] == 72 and len(result["cells"]) == 3
    assert "Cannot conclude" in stdout
    code, stdout, stderr = _run(["compare-task", out, "--task", "copy", "--length", 72, "--preset", "mpt-7b",
                                 "--score", "logprob", "--out", compare, "--force", "--json"], capsys)
    assert code == 0, stderr
    printed = json.loads(stdout)  # compare.json's object, with null where the file has NaN
    assert printed["length"] == 72 and printed["cells"] == json.loads(json.dumps(result["cells"]).replace(
        "NaN", "null"))


def test_compare_task_with_a_measured_configuration(saved, tmp_path, capsys):
    from tiny_tokenizer import WORDS

    out = tmp_path / "task"
    assert _run(["task", saved["bloom"], "--out", out, "--tasks", "kv", "--lengths", 64, "--depths",
                 "0,0.25,0.5,0.75,1", "--samples", 2, "--quiet"], capsys)[0] == 0
    texts = tmp_path / "docs.txt"
    rng = np.random.default_rng(0)
    texts.write_text("\n\n".join(" ".join(rng.choice(WORDS, 70)) for _ in range(3)) + "\n", encoding="utf-8")
    measured = tmp_path / "measured"
    code, _, stderr = _run(["measure", saved["bloom"], "--texts", texts, "--length", 64, "--samples", 3,
                            "--out", measured, "--quiet"], capsys)
    assert code == 0, stderr
    code, stdout, stderr = _run(["compare-task", out, "--measured", measured, "--out", tmp_path / "compare"], capsys)
    assert code == 0, stderr
    result = json.loads((tmp_path / "compare" / "compare.json").read_text())
    assert result["source"] == f"measured {measured}" and len(result["cells"]) == 5
    # the record influence is the rollout of the measured config, summed over the record's tokens
    import jaxroll

    profile = np.asarray(jaxroll.influence(jaxroll.load_config(measured / "config.yaml"), 64))
    rows = grid.read_rows(out / "cases.jsonl")
    first = min(rows, key=lambda row: row["depth"])
    expected = profile[first["depth"]: first["depth"] + first["record_length"]].sum()
    assert result["cells"][0]["influence"] == pytest.approx(expected, rel=1e-6)  # float32 config arithmetic


def test_resume_scores_only_the_new_cases(saved, tmp_path, capsys):
    out = tmp_path / "task"
    assert _run(["task", saved["llama"], "--out", out, "--tasks", "kv", *GRID], capsys)[0] == 0
    before = (out / "cases.jsonl").read_text().splitlines()
    code, _, stderr = _run(["task", saved["llama"], "--out", out, "--tasks", "kv", "--lengths", "66,72",
                            "--depths", "0,0.5,1", "--samples", 3, "--quiet", "--resume"], capsys)
    assert code == 0, stderr
    after = (out / "cases.jsonl").read_text().splitlines()
    assert after[: len(before)] == before and len(after) == 2 * 3 * 3
    code, _, stderr = _run(["task", saved["llama"], "--out", out, "--tasks", "kv", *GRID, "--seed", 1, "--resume"],
                           capsys)
    assert code == 2 and "--resume: seed 1 differs" in stderr


@pytest.mark.parametrize("argv, message", [
    (["--depths", "0,1.5"], "--depths: got 1.5"),
    (["--lengths", "10"], "--lengths 10: too short for kv"),
    (["--tasks", "kv,qa"], "--tasks: got 'qa'"),
    (["--lengths", "abc"], "--lengths: got 'abc'"),
])
def test_bad_input_exits_2_and_creates_nothing(saved, tmp_path, capsys, argv, message):
    out = tmp_path / "never"
    code, _, stderr = _run(["task", saved["bloom"], "--out", out, *argv], capsys)
    assert code == 2 and message in stderr and len(stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_existing_output_is_kept_without_force(saved, tmp_path, capsys):
    out = tmp_path / "task"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    code, _, stderr = _run(["task", saved["bloom"], "--out", out, *GRID], capsys)
    assert code == 2 and "not empty" in stderr and (out / "mine.txt").read_text() == "keep"


def test_two_processes_write_the_rows_of_one(saved, tmp_path, capsys):
    from test_measure_distributed import free_port

    arguments = ["task", saved["bloom"], "--tasks", "kv,copy", *GRID, "--dtype", "float64"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([str(item) for item in [*arguments, "--out", tmp_path / "single"]]) == 0
    finally:
        torch.set_num_threads(threads)
    capsys.readouterr()
    port = free_port()
    processes = []
    for rank in range(2):
        environment = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                           PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        processes.append(subprocess.Popen([sys.executable, "-m", "jaxroll", *map(str, arguments), "--out",
                                           str(tmp_path / "two")], env=environment, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
    for process in processes:
        _, stderr = process.communicate(timeout=240)
        assert process.returncode == 0, stderr
    single = {row["key"]: row for row in grid.read_rows(tmp_path / "single" / "cases.jsonl")}
    two = {row["key"]: row for row in grid.read_rows(tmp_path / "two" / "cases.jsonl")}
    assert single.keys() == two.keys() and len(two) == 2 * 2 * 3 * 2
    for key, row in single.items():
        assert two[key]["prompt_ids"] == row["prompt_ids"] and two[key]["exact"] == row["exact"]
        assert two[key]["logprob"] == pytest.approx(row["logprob"], abs=1e-12)  # float64, same per-case arithmetic
    assert not list((tmp_path / "two").glob("cases.rank*"))


def test_worked_example_runs_at_a_tiny_size(tmp_path, capsys):
    """validation/task_example.py end to end: train (2 s), task grid, measure, compare-task for each task."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("task_example", os.path.join(ROOT, "validation", "task_example.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(["--tiny", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "train.json").read_text())["steps"] >= 1
    for task in ("kv", "passkey", "copy"):
        result = json.loads((tmp_path / f"compare-{task}-96" / "compare.json").read_text())
        assert result["source"].startswith("measured") and len(result["cells"]) == 3

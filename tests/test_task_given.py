"""Token-id routes for a model without a tokenizer: `jaxroll task --cases`, `jaxroll measure` on token ids, and
`jaxroll compare-task --accuracy` with one `--measured` per length (issue 54, item 3).

Oracles: a plain float64 torch forward pass of the saved model rescoring each
case (with the sink ids written into its input by hand); the token ids of
the file itself; the rollout of each length's configuration as a NumPy
float64 product of ``(1 - lambda) I + lambda A`` rows summed over the record's
span; bad input exits 2, one line, and creates nothing.
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers  # noqa: E402
import yaml  # noqa: E402

from jaxroll.errors import ConfigError  # noqa: E402
from jaxroll.measure.texts import read_texts, select_sequences  # noqa: E402
from jaxroll.task import given  # noqa: E402
from tiny_tokenizer import run_cli  # noqa: E402

VOCAB = 40


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny random Llama saved without any tokenizer (a synthetic vocabulary, as validation/models/task-u)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      hidden_size=32, intermediate_size=64, vocab_size=VOCAB, bos_token_id=1,
                                      eos_token_id=1, pad_token_id=0)
    directory = tmp_path_factory.mktemp("llama")
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


def _cases(path, lengths=(12, 16), per=3, seed=0):
    """Random prompts with a 3-token record at depths 1, middle and end, half with each span form."""
    rng = np.random.default_rng(seed)
    rows = []
    for length in lengths:
        for depth in (1, length // 2, length - 4):
            for sample in range(per):
                row = {"prompt_ids": rng.integers(2, VOCAB, length).tolist(),
                       "answer_ids": rng.integers(2, VOCAB, 1 + sample % 2).tolist(),
                       "depth_fraction": round((depth - 1) / (length - 5), 6), "sample": sample}
                row.update({"record_start": depth, "record_end": depth + 3} if sample % 2 else
                           {"depth": depth, "record_length": 3})
                rows.append(row)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def _oracle(model_dir, row, sinks=0):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    ids = torch.tensor([[1] * sinks + row["prompt_ids"] + row["answer_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0].double()
    start = sinks + len(row["prompt_ids"]) - 1
    rows = logits[start: start + len(row["answer_ids"])]
    gold = torch.tensor(row["answer_ids"])
    return float(rows.log_softmax(-1).gather(-1, gold[:, None]).sum()), bool((rows.argmax(-1) == gold).all())


@pytest.mark.parametrize("sinks", [0, 2])
def test_task_cases_scores_the_given_ids(llama, tmp_path, capsys, sinks):
    rows = _cases(tmp_path / "cases.jsonl")
    out = tmp_path / "out"
    argv = ["task", llama, "--cases", tmp_path / "cases.jsonl", "--out", out, "--dtype", "float64", "--quiet"]
    code, stdout, stderr = run_cli(argv + (["--intervene", f"sinks={sinks}"] if sinks else []), capsys)
    assert code == 0, stderr
    scored = {(r["length"], r["depth_fraction"], r["sample"]): r
              for r in map(json.loads, (out / "cases.jsonl").read_text().splitlines())}
    assert len(scored) == len(rows)  # one line per case (written by batches of one prompt and answer length)
    for row in rows:
        got = scored[(len(row["prompt_ids"]), row["depth_fraction"], row["sample"])]
        assert got["prompt_ids"] == row["prompt_ids"] and got["answer_ids"] == row["answer_ids"]
        assert got["depth"] == row.get("record_start", row.get("depth")) and got["record_length"] == 3
        logprob, exact = _oracle(llama, row, sinks)
        assert got["logprob"] == pytest.approx(logprob, abs=1e-9) and got["exact"] == exact
    summary = (out / "summary.csv").read_text().splitlines()
    assert len(summary) == 1 + 2 * 3  # one cell per (length, depth fraction)
    settings = json.loads((out / "task.json").read_text())
    assert settings["cases"] == len(rows) and (settings["sink_tokens"] or {}).get("token_id", 1) == 1


@pytest.mark.parametrize("line, message", [
    ({"answer_ids": [3], "depth": 1, "record_length": 2}, "field 'prompt_ids'"),
    ({"prompt_ids": [2, 3, 4], "answer_ids": [], "depth": 1, "record_length": 2}, "field 'answer_ids'"),
    ({"prompt_ids": [2, 3, 4], "answer_ids": [3], "record_start": 2, "record_end": 5}, "record span [2, 5)"),
    ({"prompt_ids": [2, 3, 4], "answer_ids": [3], "depth": 1}, "field 'record_length'"),
    ({"prompt_ids": [2, 3, VOCAB], "answer_ids": [3], "depth": 1, "record_length": 1}, f"token id {VOCAB}"),
    ({"prompt_ids": [2, 3, 4], "answer_ids": [3], "depth": 1, "record_length": 1, "depth_fraction": 2},
     "field 'depth_fraction'"),
])
def test_bad_cases_exit_2_with_one_line_and_create_nothing(llama, tmp_path, capsys, line, message):
    (tmp_path / "bad.jsonl").write_text(json.dumps(line) + "\n")
    out = tmp_path / "out"
    code, _, stderr = run_cli(["task", llama, "--cases", tmp_path / "bad.jsonl", "--out", out], capsys)
    assert code == 2 and message in stderr and "line 1" in stderr and len(stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_cases_refuse_grid_flags_duplicates_and_empty_files(llama, tmp_path, capsys):
    _cases(tmp_path / "cases.jsonl")
    out = tmp_path / "out"
    code, _, stderr = run_cli(["task", llama, "--cases", tmp_path / "cases.jsonl", "--lengths", "12", "--out", out],
                              capsys)
    assert code == 2 and "--lengths: given with --cases" in stderr and not out.exists()
    line = json.dumps({"prompt_ids": [2, 3, 4], "answer_ids": [3], "depth": 1, "record_length": 1, "sample": 0})
    (tmp_path / "twice.jsonl").write_text(line + "\n" + line + "\n")
    with pytest.raises(ConfigError, match="line 2: case kv/3/.* is also line 1"):
        given.read_cases(tmp_path / "twice.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ConfigError, match="no cases"):
        given.read_cases(tmp_path / "empty.jsonl")


def test_measure_reads_token_ids_without_a_tokenizer(llama, tmp_path, capsys):
    rows = _cases(tmp_path / "cases.jsonl")
    documents = read_texts(tmp_path / "cases.jsonl")
    assert documents[0] == rows[0]["prompt_ids"]
    ids, indices = select_sequences(documents, None, 16, 3)
    wanted = [i for i, row in enumerate(rows) if len(row["prompt_ids"]) >= 16][:3]
    assert indices.tolist() == wanted and ids.tolist() == [rows[i]["prompt_ids"][:16] for i in wanted]
    out = tmp_path / "measured"
    code, _, stderr = run_cli(["measure", llama, "--texts", tmp_path / "cases.jsonl", "--length", 12, "--samples", 4,
                               "--dtype", "float64", "--out", out, "--quiet"], capsys)
    assert code == 0, stderr
    with np.load(out / "measurement.npz") as archive:
        assert archive["token_ids"].tolist() == [row["prompt_ids"][:12] for row in rows[:4]]
    (tmp_path / "mixed.jsonl").write_text('{"text": "a b"}\n{"input_ids": [2, 3]}\n')
    with pytest.raises(ConfigError, match="line 2 mixes texts and token ids"):
        read_texts(tmp_path / "mixed.jsonl")
    (tmp_path / "negative.jsonl").write_text('{"input_ids": [2, -1]}\n')
    with pytest.raises(ConfigError, match="line 1: token ids"):
        read_texts(tmp_path / "negative.jsonl")


def _dense_config(folder, length, lambdas, seed):
    """A measured-style configuration: a dense causal kernel per layer (rows sum to 1) and a lambda schedule."""
    rng = np.random.default_rng(seed)
    kernels = np.tril(rng.uniform(0.1, 1.0, (len(lambdas), length, length)))
    kernels /= kernels.sum(-1, keepdims=True)
    folder.mkdir()
    np.savez(folder / "config.kernels.npz", kernels=kernels)
    (folder / "config.yaml").write_text(yaml.safe_dump({
        "sequence_length": length, "num_layers": len(lambdas),
        "kernel_config": {"kernel_type": "dense", "file": "config.kernels.npz"},
        "lambda_schedule_config": {"schedule_type": "custom", "lambdas_custom": list(lambdas)}}))
    rollout = np.eye(length)
    for lam, kernel in zip(lambdas, kernels):
        rollout = ((1 - lam) * np.eye(length) + lam * kernel) @ rollout
    return rollout[-1]


def test_compare_task_takes_one_measurement_per_length(tmp_path, capsys):
    profiles = {8: _dense_config(tmp_path / "m8", 8, [0.6, 0.4], 1),
                12: _dense_config(tmp_path / "m12", 12, [0.7, 0.5], 2)}
    spans = {8: [(0, 2), (3, 5), (6, 8)], 12: [(0, 2), (5, 7), (10, 12)]}
    lines = ["setting,length,start,end,accuracy,n_cases"]
    lines += [f"L={n},{n},{s},{e},{0.3 + 0.1 * i},50" for n in spans for i, (s, e) in enumerate(spans[n])]
    (tmp_path / "table.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    argv = ["compare-task", "--accuracy", tmp_path / "table.csv", "--measured", tmp_path / "m8", "--measured",
            tmp_path / "m12", "--float64", "--out", out, "--json"]
    code, stdout, stderr = run_cli(argv, capsys)
    assert code == 0, stderr
    masses = [row["mass"] for row in json.loads(stdout)["rows"]]
    expected = [profiles[n][s:e].sum() for n in spans for s, e in spans[n]]
    np.testing.assert_allclose(masses, expected, rtol=0, atol=1e-12)
    code, _, stderr = run_cli(argv[:5] + ["--measured", tmp_path / "m8", "--out", tmp_path / "two"], capsys)
    assert code == 2 and "two folders measured at one length" in stderr and not (tmp_path / "two").exists()
    (tmp_path / "long.csv").write_text(lines[0] + "\nL=16,16,0,2,0.3,50\nL=8,8,0,2,0.4,50\n")
    code, _, stderr = run_cli(["compare-task", "--accuracy", tmp_path / "long.csv", *argv[3:7], "--out",
                               tmp_path / "none"], capsys)
    assert code == 2 and "no folder measured at length 16" in stderr and not (tmp_path / "none").exists()


def test_given_masses_replace_the_profiles_and_are_checked(tmp_path):
    from jaxroll.task import external

    lines = ["setting,length,start,end,accuracy,n_cases", "A,10,0,2,0.2,100", "A,10,4,6,0.4,100",
             "A,10,8,10,0.6,100", "B,10,1,3,0.3,100", "B,10,7,9,0.5,100"]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    table = external.read_accuracy_table(tmp_path / "t.csv")
    masses = np.array([0.1, 0.2, 0.4, 0.15, 0.3])
    result = external.compare_accuracy_table(table, None, fit_settings=["A"], masses=masses, resamples=50)
    link = external.fit_link(masses[:3], table.accuracy[:3], table.n_cases[:3])
    np.testing.assert_allclose(result.predicted, link(masses), rtol=1e-12)
    assert result.scores["held out"]["spearman"] == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="masses: shape"):
        external.compare_accuracy_table(table, None, masses=masses[:4])


def test_design_box_writes_a_form_beside_the_numbers():
    from jaxroll.plot.design import designed_text

    text = designed_text({"tau": 0.75, "kappa": -0.17, "kappa_form": "log1p", "gamma": 1.5}).splitlines()
    assert text[1:] == ["tau = 0.75", "kappa = -0.17", "kappa_form = log1p", "gamma = 1.5"]


def test_a_grid_on_a_model_without_tokenizer_points_to_cases(llama, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, stderr = run_cli(["task", llama, "--out", out, "--tasks", "kv", "--lengths", "66"], capsys)
    assert code == 2 and "no tokenizer" in stderr and "--cases FILE.jsonl" in stderr and not out.exists()

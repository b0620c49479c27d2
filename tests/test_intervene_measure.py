"""``measure`` and ``task`` under an intervention: the measured quantities are those of the patched model.

Oracles:

- an identity intervention (tau = 1, slope_scale = 1, kappa = 0, gamma = 1)
  leaves every output of `measure` unchanged (float64, 1e-10);
- the mean attention that `measure` recomputes in chunks from q and k under
  SDPA equals the one the patched eager model returns (float64, 1e-10; the
  eager patch itself is checked by hand in tests/test_patching.py);
- lambda under ``gamma`` reads the scaled update: at layer 1 (input
  unchanged) it is ``mean_i g ||a_i|| / (||x_i|| + g ||a_i||)`` of the
  unpatched model's own x and a, read by plain hooks;
- a task case's score is rescored by a plain forward of the saved model
  under the same patch;
- bad names, values and families exit 2 with one line before ``--out`` exists.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_task import VOCAB as TASK_VOCAB, task_tokenizer  # noqa: E402
from tiny_tokenizer import save_tiny, word_texts  # noqa: E402

import jaxroll  # noqa: E402
from tiny_tokenizer import run_cli as _run  # noqa: E402
from jaxroll.interventions import parse  # noqa: E402
from jaxroll.measure.patching import patch  # noqa: E402
from jaxroll.measure import measure  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py

VOCAB, N, S = 64, 10, 3


def _config(family, vocab=VOCAB):
    T = transformers
    return {"bloom": lambda: T.BloomConfig(n_layer=2, n_head=4, hidden_size=16, vocab_size=vocab),
            "llama": lambda: T.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                           hidden_size=16, intermediate_size=24, vocab_size=vocab),
            "gpt2": lambda: T.GPT2Config(n_layer=2, n_head=4, n_embd=16, vocab_size=vocab, n_positions=128,
                                         bos_token_id=0, eos_token_id=0),
            "mpt": lambda: T.MptConfig(n_layers=2, n_heads=4, d_model=16, vocab_size=vocab, max_seq_len=32),
            "falcon": lambda: T.FalconConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=16, alibi=True,
                                             vocab_size=vocab, new_decoder_architecture=False, multi_query=False,
                                             bias=True)}[family]()


def tiny(family, implementation):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(family), attn_implementation=implementation)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(4.0) if parameter.ndim == 2 else parameter.add_(0.1 * torch.randn_like(parameter))
    return model.double().eval()


def _ids():
    return np.random.default_rng(3).integers(0, VOCAB, size=(S, N))


IDENTITY = {"bloom": "tau=1,slope_scale=1,kappa=0,gamma=1", "mpt": "tau=1,slope_scale=1,kappa=0,gamma=1",
            "llama": "tau=1,kappa=0,gamma=1"}
ALIBI_STATS = ("lambda", "content", "influence", "attention")
STATS = {"bloom": ALIBI_STATS, "mpt": ALIBI_STATS, "llama": ("lambda", "influence", "attention")}


@pytest.mark.parametrize("family, implementation", [("bloom", "eager"), ("mpt", "eager"), ("llama", "sdpa"),
                                                    ("llama", "eager")])
def test_an_identity_intervention_leaves_the_measurement_unchanged(family, implementation):
    model = tiny(family, implementation)
    plain = measure(model, _ids(), stats=STATS[family], batch_size=2)
    changed = measure(model, _ids(), stats=STATS[family], batch_size=2, interventions=parse(IDENTITY[family]))
    # The same arrays, plus the record of what was done (identity values, but an intervention nonetheless).
    assert changed.arrays().keys() - plain.arrays().keys() == {"interventions"}
    for name, value in plain.arrays().items():
        np.testing.assert_allclose(changed.arrays()[name], value, rtol=0, atol=1e-10, err_msg=name)
    assert plain.metadata["interventions"] == {}
    assert changed.metadata["interventions"] == jaxroll.interventions.describe(parse(IDENTITY[family]))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_recomputed_attention_rows_are_the_patched_models(family):
    changes = parse("tau=0.6,kappa=-0.8,kappa_form=unsquash,ssmax_scale=1.3")
    recomputed = measure(tiny(family, "sdpa"), _ids(), stats=("attention",), interventions=changes)
    assert recomputed.metadata["attention_rows"] == "recomputed from q, k in chunks"
    eager = measure(tiny(family, "eager"), _ids(), stats=("attention",), interventions=changes)
    plain = measure(tiny(family, "eager"), _ids(), stats=("attention",))
    np.testing.assert_allclose(recomputed.attention_mean, eager.attention_mean, rtol=0, atol=1e-10)
    assert np.abs(eager.attention_mean - plain.attention_mean).max() > 1e-3  # the change is visible


@pytest.mark.parametrize("family, implementation", [("llama", "sdpa"), ("bloom", "eager"), ("mpt", "eager")])
def test_lambda_reads_the_scaled_attention_update(family, implementation):
    model = tiny(family, implementation)
    ids = _ids()
    from jaxroll.measure.layer_maps import resolve
    from jaxroll.measure.precision import full_precision

    resolved = resolve(model)
    seen = {}
    handles = [resolved.blocks[0].register_forward_pre_hook(
        lambda module, args, kwargs: seen.__setitem__("x", (args[0] if args else kwargs["hidden_states"]).detach()),
        with_kwargs=True),
        resolved.output_projections[0].register_forward_hook(
            lambda module, args, output: seen.__setitem__("a", output.detach()))]
    try:
        with torch.no_grad(), full_precision(model):
            model(torch.as_tensor(ids), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    x, a = seen["x"].norm(dim=-1).numpy(), seen["a"].norm(dim=-1).numpy()
    gamma = 2.5
    expected = (gamma * a / (x + gamma * a)).mean(axis=-1)  # per sequence, layer 1
    result = measure(model, ids, stats=("lambda",), interventions=parse(f"gamma={gamma}"))
    np.testing.assert_allclose(result.lambdas_per_sequence[:, 0], expected, rtol=1e-10)
    removed = measure(model, ids, stats=("lambda",), interventions=[jaxroll.interventions.BranchScale([0.0, 1.0])])
    assert np.all(removed.lambdas_per_sequence[:, 0] == 0.0)


# The command line: tiny models saved with a word-level tokenizer.

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return {family: save_tiny(tmp_path_factory.mktemp(family), _config(family))
            for family in ("bloom", "llama", "falcon")}


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    return word_texts(tmp_path_factory.mktemp("texts") / "docs.txt", [20] * 4)


def test_measure_intervene_records_the_change_in_every_output(saved, texts, tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, stderr = _run(["measure", saved["bloom"], "--texts", texts, "--length", 12, "--samples", 2,
                                 "--out", out, "--quiet", "--intervene", "tau=0.5,gamma=0.8"], capsys)
    assert code == 0, stderr
    assert "intervened: tau=0.5, gamma=0.8" in stdout
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["interventions"] == {"tau": 0.5, "gamma": 0.8}
    with np.load(out / "measurement.npz", allow_pickle=False) as archive:  # the archive alone says it too
        assert json.loads(str(archive["interventions"])) == {"tau": 0.5, "gamma": 0.8}
    first = (out / "config.yaml").read_text().splitlines()[0]
    assert first.startswith("# measured under the interventions") and '"tau": 0.5' in first
    jaxroll.load_config(out / "config.yaml")  # still a rollout configuration
    plain = tmp_path / "plain"
    assert _run(["measure", saved["bloom"], "--texts", texts, "--length", 12, "--samples", 2, "--out", plain,
                 "--quiet"], capsys)[0] == 0
    with np.load(out / "measurement.npz") as changed, np.load(plain / "measurement.npz") as baseline:
        assert not np.allclose(changed["influence"], baseline["influence"])


@pytest.mark.parametrize("family, text, message", [
    ("bloom", "temperature=0.5", "--intervene temperature: unknown intervention"),
    ("bloom", "tau=-1", "tau:"),
    ("bloom", "tau=abc", "--intervene tau: got 'abc'"),
    ("llama", "slope_scale=2", "slope_scale: a llama model has rope positions"),
    ("falcon", "tau=0.5", "tau: the falcon family's attention cannot be patched"),
])
@pytest.mark.parametrize("command", ["measure", "task"])
def test_bad_interventions_exit_2_in_one_line_before_out_exists(saved, texts, tmp_path, capsys, family, text,
                                                                  message, command):
    out = tmp_path / "never"
    extra = ["--texts", texts, "--length", 12, "--samples", 2] if command == "measure" else ["--quiet"]
    code, _, stderr = _run([command, saved[family], "--out", out, *extra, "--intervene", text], capsys)
    assert code == 2 and message in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_task_intervene_scores_the_patched_model_and_resume_must_match(tmp_path, capsys):
    from jaxroll.task import grid

    torch.manual_seed(0)
    directory = tmp_path / "llama"
    transformers.AutoModelForCausalLM.from_config(_config("llama", TASK_VOCAB)).save_pretrained(directory)
    task_tokenizer().save_pretrained(directory)
    out = tmp_path / "task"
    arguments = ["task", directory, "--out", out, "--tasks", "copy", "--lengths", 66, "--depths", "0,1",
                 "--samples", 1, "--quiet", "--dtype", "float64"]
    code, _, stderr = _run([*arguments, "--intervene", "tau=0.4,kappa=-1"], capsys)
    assert code == 0, stderr
    assert json.loads((out / "task.json").read_text())["interventions"] == {
        "tau": 0.4, "kappa": -1.0, "kappa_form": "log1p", "kappa_k": 2.0}
    row = grid.read_rows(out / "cases.jsonl")[-1]
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64).eval()
    ids = torch.tensor([row["prompt_ids"] + row["answer_ids"]])
    start = len(row["prompt_ids"]) - 1
    gold = torch.tensor(row["answer_ids"])

    def logprob(logits):
        rows = logits[0, start: start + len(row["answer_ids"])].double()
        return float(rows.log_softmax(-1).gather(-1, gold[:, None]).sum())

    with torch.no_grad():
        plain = logprob(model(ids).logits)
        with patch(model, parse("tau=0.4,kappa=-1")):
            changed = logprob(model(ids).logits)
    assert row["logprob"] == pytest.approx(changed, abs=1e-9) and abs(changed - plain) > 1e-6
    code, _, stderr = _run([*arguments, "--resume", "--intervene", "tau=0.5"], capsys)
    assert code == 2 and "--resume: interventions" in stderr
    code, _, stderr = _run([*arguments, "--resume"], capsys)
    assert code == 2 and "--resume: interventions {} differs" in stderr


@pytest.mark.parametrize("family", ["bloom", "mpt"])
def test_content_reads_the_models_own_query_under_a_query_scale(family):
    # Layer 1's q and k depend on the embeddings only: a patch that scales the fused query
    # must leave what the measurement's projection hook reads unchanged there.
    model = tiny(family, "eager")
    plain = measure(model, _ids(), stats=("content", "attention"))
    changed = measure(model, _ids(), stats=("content", "attention"), interventions=parse("tau=0.4,ssmax_scale=1.5"))
    np.testing.assert_allclose(changed.content_diagonal[0], plain.content_diagonal[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(changed.content_base[0], plain.content_base[0], rtol=0, atol=1e-12)
    assert np.abs(changed.attention_mean[0] - plain.attention_mean[0]).max() > 1e-3

"""The torch side of `RotaryRescale` and `SinkTokens` against oracles written here.

Rotary rescale: a float64 NumPy forward of each attention from its own
weights (`test_patching.hand_qkv`'s projections), rotated in the test at
``p / r_h`` per head, ``angle_i = theta^(-2i/d) p / r_h`` from the config's
``rope_theta``; its softmax against the patched eager model's
probabilities, ``W_O (A v)`` against the patched SDPA output, and the
chunked row recomputation alike (1e-10 float64, 1e-6 float32).

Sinks: `measure --intervene sinks=k` against a forward and autograd written
here on a hand-built batch (the k sink ids in front of each sequence):
``||d max_v softmax(logits_{N+k-1})_v / d e_j||``, its split into the
sinks' share and the profile over the N originals renormalised (1e-10).
A task case under sinks is rescored by hand. Refusals are one line, exit 2,
before ``--out`` exists.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_patching import (HEAD_DIM, HEADS, LAYERS, N, ROTARY, VOCAB, _attentions, _ids, _linear, _np,  # noqa: E402
                           _run_patched, hand_output, snapshot, assert_same, softmax, tiny)
from tiny_tokenizer import save_tiny, word_level_tokenizer, word_texts  # noqa: E402

from jaxroll import ConfigError  # noqa: E402
from tiny_tokenizer import run_cli as _run  # noqa: E402
from jaxroll.interventions import RotaryRescale, SinkTokens, parse  # noqa: E402
from jaxroll.measure.patching import patch  # noqa: E402
from jaxroll.measure.torch_plan import check  # noqa: E402
from jaxroll.measure import measure  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py

# One ratio per key-value group (2 groups of 2 query heads), different per layer.
RATIOS = {"one": 2.0, "per head": [1.5, 1.5, 0.7, 0.7], "per layer and head": [[3.0, 3.0, 1.0, 1.0],
                                                                                [0.5, 0.5, 2.5, 2.5]]}


def _rescaled(x, theta, ratios):
    """x ``(B, N, H, d)`` rotated at ``p / r_h``: ``x cos + rotate_half(x) sin`` at those angles."""
    d = x.shape[-1]
    inverse = 1.0 / theta ** (np.arange(0, d, 2) / d)
    angles = (np.arange(x.shape[1])[None, :, None] / np.asarray(ratios)[:, None, None]) * inverse  # (H, N, d/2)
    angles = np.concatenate([angles, angles], -1).transpose(1, 0, 2)  # (N, H, d)
    turned = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * np.cos(angles)[None] + turned * np.sin(angles)[None]


def hand_rescaled(attention, x, config, ratios):
    """q rotated at p / r_h; the keys of key-value group g at p / r of g's first query head (Ms-PoE's
    ``cos[::num_key_value_groups]``), then repeated; v repeated to H heads; from the module's weights:
    ``(B, N, H, d)`` each."""
    theta = config.rope_parameters["rope_theta"]
    B = x.shape[0]
    q = _linear(attention.q_proj, x).reshape(B, N, HEADS, HEAD_DIM)
    k = _linear(attention.k_proj, x).reshape(B, N, -1, HEAD_DIM)
    v = _linear(attention.v_proj, x).reshape(B, N, -1, HEAD_DIM)
    groups = HEADS // k.shape[2]
    first = [np.asarray(ratios)[g * groups] for g in range(k.shape[2])]
    k = np.repeat(_rescaled(k, theta, first), groups, axis=2)
    return _rescaled(q, theta, ratios), k, np.repeat(v, groups, axis=2)


def _per_layer(ratio):
    return np.broadcast_to(np.asarray(ratio, dtype=np.float64), (LAYERS, HEADS))


def _causal_softmax(q, k):
    z = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(HEAD_DIM)
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]
    return softmax(np.where(j <= i, z, -np.inf))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("name", list(RATIOS))
def test_rotary_rescale_matches_the_hand_rotated_attention(family, implementation, name):
    model = tiny(family, implementation)
    eager = implementation == "eager"
    changes = [RotaryRescale(RATIOS[name])]
    inputs, outputs, probabilities = _run_patched(model, family, changes, _ids(), eager)
    ratios = _per_layer(RATIOS[name])
    for layer, attention in enumerate(_attentions(model, family)):
        q, k, v = hand_rescaled(attention, inputs[layer], model.config, ratios[layer])
        expected = _causal_softmax(q, k)
        if eager:
            np.testing.assert_allclose(probabilities[layer], expected, rtol=0, atol=1e-10)
        np.testing.assert_allclose(outputs[layer], hand_output(family, attention, expected, v), rtol=0, atol=1e-10)
    # The change is visible: ratio 1 is a different forward.
    _, _, plain = _run_patched(model, family, [RotaryRescale(1.0)], _ids(), True) if eager else (0, 0, None)
    if eager:
        assert max(np.abs(p - e).max() for p, e in zip(plain, probabilities)) > 1e-3


def test_rotary_rescale_in_float32_matches_the_float64_oracle():
    model = tiny("llama", "sdpa", dtype=torch.float32)
    ratio = RATIOS["per layer and head"]
    inputs, outputs, _ = _run_patched(model, "llama", [RotaryRescale(ratio), parse("tau=0.7")[0]], _ids(), False)
    for layer, attention in enumerate(_attentions(model, "llama")):
        q, k, v = hand_rescaled(attention, inputs[layer], model.config, _per_layer(ratio)[layer])
        expected = _causal_softmax(q / 0.7, k)
        scale = np.abs(outputs[layer]).max()
        np.testing.assert_allclose(outputs[layer] / scale, hand_output("llama", attention, expected, v) / scale,
                                   rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_recomputed_rows_under_a_rotary_rescale_are_the_patched_attention(family):
    # measure under SDPA recomputes the rows from the hooked q, k: the same re-rotation as the patched eager model.
    ids = _ids().numpy()
    changes = [RotaryRescale(RATIOS["per layer and head"])]
    recomputed = measure(tiny(family, "sdpa"), ids, stats=("attention",), interventions=changes)
    assert recomputed.metadata["attention_rows"] == "recomputed from q, k in chunks"
    model = tiny(family, "eager")
    inputs, _, probabilities = _run_patched(model, family, changes, torch.as_tensor(ids), True)
    expected = []
    for layer, attention in enumerate(_attentions(model, family)):
        q, k, _ = hand_rescaled(attention, inputs[layer], model.config, _per_layer(RATIOS["per layer and head"])[layer])
        expected.append(_causal_softmax(q, k).mean(axis=(0, 1)))
    np.testing.assert_allclose(recomputed.attention_mean, np.stack(expected), rtol=0, atol=1e-10)
    np.testing.assert_allclose(recomputed.attention_mean, np.stack([p.mean(axis=(0, 1)) for p in probabilities]),
                               rtol=0, atol=1e-10)


def test_the_model_is_bit_identical_after_a_rotary_rescale():
    model = tiny("llama", "sdpa")
    ids = _ids()
    with torch.no_grad():
        baseline = model(ids).logits
    before = snapshot(model)
    with torch.no_grad(), patch(model, parse("rotary_ratio=2,tau=0.5")):
        changed = model(ids).logits
    assert not torch.allclose(changed, baseline)
    with pytest.raises(RuntimeError), patch(model, parse("rotary_ratio=0.5")):
        raise RuntimeError("inside")
    assert_same(before, snapshot(model))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, baseline)


@pytest.mark.parametrize("config, text, message", [
    ("bloom", "rotary_ratio=2", "rotary_ratio: a bloom model has alibi positions"),
    ("gpt2", "rotary_ratio=2", "rotary_ratio: a gpt2 model has learned positions"),
    ("linear", "rotary_ratio=2", "rotary_ratio: rope_scaling type 'linear' is not supported"),
    ("qwen3", "rotary_ratio=2", "rotary_ratio: the qwen3 family's rotary module is not mapped"),
])
def test_check_refuses_a_rotary_rescale_it_cannot_apply(tmp_path, config, text, message):
    T = transformers
    config = {"bloom": lambda: T.BloomConfig(n_layer=2, n_head=4, hidden_size=16, vocab_size=VOCAB),
              "gpt2": lambda: T.GPT2Config(n_layer=2, n_head=4, n_embd=16, vocab_size=VOCAB),
              "linear": lambda: T.LlamaConfig(**ROTARY, rope_scaling={"rope_type": "linear", "factor": 2.0}),
              "llama": lambda: T.LlamaConfig(**ROTARY),
              "qwen3": lambda: T.Qwen3Config(**ROTARY, head_dim=4)}[config]()
    if "[" in text:
        path = tmp_path / "ratios.yaml"
        path.write_text("rotary_ratio: [1, 2, 1, 1]\n")
        text = str(path)
    with pytest.raises(ConfigError, match=message) as refused:
        check(parse(text), config)
    assert "\n" not in str(refused.value)


# Sinks in measure: a hand-built batch with the k sink ids in front, float64 autograd written here.

S, LENGTH = 3, 8


def _sequences():
    return np.random.default_rng(5).integers(0, VOCAB, size=(S, LENGTH))


def hand_sink_influence(model, ids, k, sink_id):
    """Per sequence: the gradient norms at the N + k positions of ``max_v softmax(logits_{N+k-1})_v``."""
    from jaxroll.measure.precision import full_precision

    norms = []
    for row in ids:
        batch = torch.as_tensor(np.concatenate([np.full(k, sink_id), row]))[None]
        with full_precision(model):
            embeddings = model.get_input_embeddings()(batch).detach().requires_grad_(True)
            logits = model(inputs_embeds=embeddings, use_cache=False).logits[0, -1].double()
            (gradient,) = torch.autograd.grad(torch.softmax(logits, -1).max(), embeddings)
        norms.append(gradient[0].norm(dim=-1).numpy())
    return np.stack(norms)  # (S, N + k)


@pytest.mark.parametrize("family, implementation", [("llama", "sdpa"), ("bloom", "eager"), ("gpt2", "eager")])
@pytest.mark.parametrize("k", [1, 3])
def test_measure_with_sinks_equals_the_hand_computed_influence_and_sink_mass(family, implementation, k):
    model = tiny(family, implementation)
    ids = _sequences()
    result = measure(model, ids, stats=("influence",), batch_size=2, interventions=parse(f"sinks={k}"))
    sink_id = {"llama": 1, "bloom": 1, "gpt2": 0}[family]  # the config's bos_token_id (no tokenizer given)
    assert result.metadata["sink_tokens"] == {"count": k, "token_id": sink_id, "token": "the config's bos_token_id",
                                              "run_length": LENGTH + k,
                                              "sink_mass_mean": pytest.approx(result.metadata["sink_tokens"][
                                                  "sink_mass_mean"])}
    norms = hand_sink_influence(model, ids, k, sink_id)
    originals = norms[:, k:]
    np.testing.assert_allclose(result.influence_per_sequence, originals, rtol=0, atol=1e-10)
    mean = originals.mean(axis=0)
    np.testing.assert_allclose(result.influence, mean / mean.sum(), rtol=0, atol=1e-10)
    assert result.influence.shape == (LENGTH,) and abs(result.influence.sum() - 1) < 1e-12
    sink_mass = norms[:, :k].sum(axis=1) / norms.sum(axis=1)
    np.testing.assert_allclose(result.extra["sink_mass"], sink_mass, rtol=0, atol=1e-10)
    assert result.metadata["sink_tokens"]["sink_mass_mean"] == pytest.approx(sink_mass.mean(), abs=1e-10)
    assert sink_mass.min() > 1e-6  # the sinks take a visible share
    np.testing.assert_array_equal(result.token_ids, ids)  # the originals, as without sinks


def test_lambda_and_attention_under_sinks():
    # lambda over the N original positions (hand: the block input and attention output norms after the sinks);
    # the attention at the model's N + k positions.
    model = tiny("llama", "eager")
    ids, k = _sequences(), 2
    from jaxroll.measure.layer_maps import resolve
    from jaxroll.measure.precision import full_precision

    resolved = resolve(model)
    seen = {}
    handles = [resolved.blocks[0].register_forward_pre_hook(
        lambda module, args, kwargs: seen.__setitem__("x", (args[0] if args else kwargs["hidden_states"]).detach()),
        with_kwargs=True),
        resolved.output_projections[0].register_forward_hook(
            lambda module, args, output: seen.__setitem__("a", output.detach()))]
    batch = torch.as_tensor(np.concatenate([np.full((S, k), 1), ids], axis=1))
    try:
        with torch.no_grad(), full_precision(model):
            attentions = model(batch, use_cache=False, output_attentions=True).attentions
    finally:
        for handle in handles:
            handle.remove()
    x, a = seen["x"].norm(dim=-1).numpy()[:, k:], seen["a"].norm(dim=-1).numpy()[:, k:]
    result = measure(model, ids, stats=("lambda", "attention"), interventions=parse(f"sinks={k}"))
    np.testing.assert_allclose(result.lambdas_per_sequence[:, 0], (a / (x + a)).mean(axis=-1), rtol=0, atol=1e-12)
    assert result.attention_mean.shape == (LAYERS, LENGTH + k, LENGTH + k)
    np.testing.assert_allclose(result.attention_mean, np.stack([_np(p).mean(axis=(0, 1)) for p in attentions]),
                               rtol=0, atol=1e-10)


def test_identity_sinks_and_ratio_leave_the_measurement_unchanged():
    model = tiny("llama", "sdpa")
    ids = _sequences()
    stats = ("lambda", "influence", "attention")
    plain = measure(model, ids, stats=stats, batch_size=2)
    changed = measure(model, ids, stats=stats, batch_size=2, interventions=parse("sinks=0,rotary_ratio=1"))
    # The same arrays, plus the record of what was done (identity values, but interventions nonetheless).
    assert changed.arrays().keys() - plain.arrays().keys() == {"interventions"}
    for name, value in plain.arrays().items():
        np.testing.assert_allclose(changed.arrays()[name], value, rtol=0, atol=1e-10, err_msg=name)
    assert changed.metadata["sink_tokens"] is None


# The command line.

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    T = transformers
    directories = {}
    configs = {"bloom": T.BloomConfig(n_layer=2, n_head=4, hidden_size=16, vocab_size=64),
               "mpt": T.MptConfig(n_layers=2, n_heads=4, d_model=16, vocab_size=64, max_seq_len=16),
               "gpt2": T.GPT2Config(n_layer=2, n_head=4, n_embd=16, vocab_size=64, n_positions=16),
               "llama_linear": T.LlamaConfig(**{**ROTARY, "vocab_size": 64},
                                             rope_scaling={"rope_type": "linear", "factor": 2.0})}
    for name, config in configs.items():
        tokenizer = word_level_tokenizer()
        if name == "bloom":
            tokenizer.bos_token = "w3"  # id 4
        directories[name] = save_tiny(tmp_path_factory.mktemp(name), config, tokenizer)
    return directories


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    return word_texts(tmp_path_factory.mktemp("texts") / "docs.txt", [20] * 4)


def test_measure_intervene_sinks_writes_the_originals_and_the_sink_mass(saved, texts, tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, stderr = _run(["measure", saved["bloom"], "--texts", texts, "--length", 10, "--samples", 3,
                                 "--out", out, "--quiet", "--dtype", "float64", "--intervene", "sinks=2"], capsys)
    assert code == 0, stderr
    assert "sinks: 2 tokens of id 4 (the tokenizer's bos_token_id)" in stdout and "sink_mass mean" in stdout
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["interventions"] == {"sinks": 2}
    assert metadata["sink_tokens"]["token_id"] == 4 and metadata["sink_tokens"]["run_length"] == 12
    profile = np.loadtxt(out / "influence.csv", delimiter=",", skiprows=1, usecols=-1)
    assert profile.shape == (10,) and abs(profile.sum() - 1) < 1e-9
    with np.load(out / "measurement.npz") as arrays:
        assert arrays["sink_mass"].shape == (3,) and arrays["influence_per_sequence"].shape == (3, 10)
        model = transformers.AutoModelForCausalLM.from_pretrained(saved["bloom"], dtype=torch.float64).eval()
        norms = hand_sink_influence(model, arrays["token_ids"], 2, 4)
        np.testing.assert_allclose(arrays["sink_mass"], norms[:, :2].sum(1) / norms.sum(1), rtol=0, atol=1e-10)
        np.testing.assert_allclose(arrays["influence_per_sequence"], norms[:, 2:], rtol=0, atol=1e-10)
    assert abs(metadata["sink_tokens"]["sink_mass_mean"] - float(np.mean(norms[:, :2].sum(1) / norms.sum(1)))) < 1e-10


@pytest.mark.parametrize("name, extra, message", [
    ("mpt", ["--intervene", "sinks=8"], "--length: 10 with sinks=8 runs 18 positions; allowed: at most the model's "
                                        "max_seq_len (16)"),
    ("gpt2", ["--intervene", "sinks=7"], "--length: 10 with sinks=7 runs 17 positions; allowed: at most the model's "
                                         "n_positions (16)"),
    ("bloom", ["--intervene", "rotary_ratio=2"], "rotary_ratio: a bloom model has alibi positions"),
    ("llama_linear", ["--intervene", "rotary_ratio=2"], "rotary_ratio: rope_scaling type 'linear' is not supported"),
    ("bloom", ["--intervene", "sinks=2", "--queries", "2"], "--queries: with sinks=2"),
    ("bloom", ["--intervene", "sinks=1.5"], "sinks: got 1.5; allowed: an integer >= 0"),
])
def test_measure_refuses_in_one_line_before_out_exists(saved, texts, tmp_path, capsys, name, extra, message):
    out = tmp_path / "never"
    code, _, stderr = _run(["measure", saved[name], "--texts", texts, "--length", 10, "--samples", 2, "--out", out,
                            "--quiet", *extra], capsys)
    assert code == 2 and message in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_task_under_sinks_rescored_by_hand(tmp_path, capsys):
    from test_task import VOCAB as TASK_VOCAB, task_tokenizer

    from jaxroll.task import grid

    torch.manual_seed(0)
    directory = tmp_path / "llama"
    config = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      hidden_size=16, intermediate_size=24, vocab_size=TASK_VOCAB)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    task_tokenizer().save_pretrained(directory)  # no BOS or EOS: the sinks are id 0
    out = tmp_path / "task"
    code, _, stderr = _run(["task", directory, "--out", out, "--tasks", "copy", "--lengths", 66, "--depths", "0,1",
                            "--samples", 1, "--quiet", "--dtype", "float64", "--intervene", "sinks=3,rotary_ratio=2"],
                           capsys)
    assert code == 0, stderr
    settings = json.loads((out / "task.json").read_text())
    assert settings["interventions"] == {"sinks": 3, "rotary_ratio": 2.0}
    assert settings["sink_tokens"] == {"count": 3, "token_id": 0, "token": "no bos_token_id or eos_token_id"}
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64).eval()
    for row in grid.read_rows(out / "cases.jsonl"):
        assert len(row["prompt_ids"]) == 66  # the prompt's own ids; the sinks go in front of them
        ids = torch.tensor([[0, 0, 0] + row["prompt_ids"] + row["answer_ids"][:-1]])
        start = 3 + len(row["prompt_ids"]) - 1  # the answer positions, shifted by the 3 sinks
        gold = torch.tensor(row["answer_ids"])

        def logprob(logits, first):
            rows = logits[0, first: first + len(row["answer_ids"])].double()
            return float(rows.log_softmax(-1).gather(-1, gold[:, None]).sum())

        with torch.no_grad(), patch(model, [RotaryRescale(2.0)]):
            expected = logprob(model(ids).logits, start)
            without_sinks = logprob(model(ids[:, 3:]).logits, start - 3)
        assert row["logprob"] == pytest.approx(expected, abs=1e-9) and abs(expected - without_sinks) > 1e-6


def test_task_refuses_sinks_beyond_the_position_limit(tmp_path, capsys):
    from test_task import VOCAB as TASK_VOCAB, task_tokenizer

    directory = tmp_path / "mpt"
    transformers.AutoModelForCausalLM.from_config(transformers.MptConfig(
        n_layers=2, n_heads=4, d_model=16, vocab_size=TASK_VOCAB, max_seq_len=80)).save_pretrained(directory)
    task_tokenizer().save_pretrained(directory)
    capsys.readouterr()  # the saving's progress bars
    out = tmp_path / "never"
    code, _, stderr = _run(["task", directory, "--out", out, "--tasks", "copy", "--lengths", 66, "--quiet",
                            "--intervene", "sinks=8"], capsys)
    assert code == 2 and "--lengths: 66 with sinks=8 and 8 answer tokens runs 82 positions; allowed: at most the " \
                          "model's max_seq_len (80)" in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1 and not out.exists()

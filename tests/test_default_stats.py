"""The default statistics: the measured kernel of a model without ALiBi, dense while cheap, by offset beyond.

Oracles: the line itself (``8 L N^2`` bytes against `DENSE_DEFAULT_BYTES`,
checked on both sides of it); a tiny rotary model's own eager attention
(float64 end to end, ``output_attentions``) read by offset in NumPy, and a
NumPy float64 rollout of the offset kernel written out,

    K_t[i, j] = (1 / H) sum_h a_{t,h}(i - j) / sum_{o <= i} a_{t,h}(o),
    P = prod_t ((1 - lambda_t) I + lambda_t K_t),   influence = P[N - 1] (sums to 1),

against the profile of the config.yaml that the default measurement writes
(read by `jaxroll.load_config` and by ``jaxroll rollout``), 1e-10; and the
same rollout with every score divided by tau (``a^(1/tau)`` renormalised)
against ``--intervene tau=...`` on that config.
"""

import csv

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxroll  # noqa: E402
from jaxroll.cli import main  # noqa: E402
from jaxroll.measure import measure, registry, write_measurement  # noqa: E402
from jaxroll.measure.precision import full_precision  # noqa: E402
from tiny_tokenizer import WORDS, word_level_tokenizer  # noqa: E402

VOCAB, HEADS, N = 64, 4, 12
LINE = registry.DENSE_DEFAULT_BYTES


def test_the_line_between_the_dense_and_the_offset_default():
    for position in ("rope", "learned"):
        content = ("content",) if position == "learned" else ()
        base = ("lambda", *content, "influence")
        # 8 L N^2 = 64 MiB exactly at L = 2, N = 2048; one more token is past it.
        assert registry.default_stats(position, 2048, 2) == base + ("attention", "paths")
        assert registry.default_stats(position, 2049, 2) == base + ("attention_offsets", "paths")
        assert 8 * 2 * 2048 ** 2 == LINE
        assert registry.default_stats(position, 512, 32) == base + ("attention", "paths")
        assert registry.default_stats(position, 513, 32) == base + ("attention_offsets", "paths")
        assert registry.default_stats(position) == base + ("attention_offsets", "paths")  # N unknown: the one that scales
    tables = ("attention_gains", "attention_distances")  # N <= 362 at L = 4 (16 L N^2 floats in 64 MiB)
    for length, expected in ((None, ()), (64, tables), (362, tables), (363, ()), (10**6, ())):
        assert registry.default_stats("alibi", length, 4) == ("lambda", "content", "influence", *expected, "paths")


def _llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=2,
                                      hidden_size=32, intermediate_size=64, vocab_size=VOCAB)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():  # attention well away from uniform
        for name, parameter in model.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                parameter.mul_(4.0)
    return model


def _dense_offsets(model, token_ids):
    """a_{t,h}(o) = mean_s (1 / (N - o)) sum_{i >= o} A[i, i - o], from the model's own probabilities."""
    with torch.no_grad(), full_precision(model):
        attentions = model(torch.as_tensor(token_ids), output_attentions=True, use_cache=False).attentions
    p = np.stack([a.numpy() for a in attentions])  # (L, S, H, N, N)
    n = p.shape[-1]
    out = np.zeros((p.shape[0], p.shape[2], n))
    for o in range(n):
        out[:, :, o] = np.mean([p[:, :, :, i, i - o] for i in range(o, n)], axis=0).mean(axis=1)
    return out


def _numpy_rollout(offsets, lambdas, tau=1.0, ratios=None):
    """The offset kernel's rollout; with `ratios` r_t the probability path's share form (docs/design.md):
    ``W = 1 - rho + rho / tau``, ``R = ((1 - lambda) I + lambda W K) / (1 - lambda + lambda W)``."""
    layers, heads, n = offsets.shape
    shares = np.zeros(layers) if ratios is None else ratios / (1.0 + ratios)
    product = np.eye(n)
    for t in range(layers):
        kernel = np.zeros((n, n))
        for h in range(heads):
            for i in range(n):
                row = offsets[t, h, i - np.arange(i + 1)] ** (1.0 / tau)
                kernel[i, : i + 1] += row / row.sum() / heads
        weight = 1.0 - shares[t] + shares[t] / tau
        layer = ((1 - lambdas[t]) * np.eye(n) + lambdas[t] * weight * kernel) / (1 - lambdas[t] + lambdas[t] * weight)
        product = layer @ product
    return product[-1]


def test_the_default_measurement_of_a_rotary_model_past_the_line_is_its_offset_kernel(monkeypatch, tmp_path):
    monkeypatch.setattr(registry, "DENSE_DEFAULT_BYTES", 8 * 2 * N * N - 1)  # N = 12 is past the line
    model = _llama().double().eval()
    token_ids = np.random.default_rng(0).integers(0, VOCAB, (3, N))
    result = measure(model, token_ids)  # stats: the default at this N and depth
    assert result.metadata["stats"] == ["lambda", "influence", "attention_offsets", "paths"]
    assert result.attention_mean is None
    offsets = _dense_offsets(model, token_ids)
    np.testing.assert_allclose(result.extra["attention_offsets"], offsets, rtol=0, atol=1e-10)
    write_measurement(result, tmp_path)
    text = (tmp_path / "config.yaml").read_text()
    assert "family: table" in text and "alibi_slopes" not in text and (tmp_path / "config.kernels.npz").is_file()
    loaded = jaxroll.load_config(tmp_path / "config.yaml")
    assert isinstance(loaded.kernel, jaxroll.kernel_types.TableKernel)
    expected = _numpy_rollout(offsets, np.clip(result.lambdas, 0, 1))
    assert abs(expected.sum() - 1) < 1e-12
    np.testing.assert_allclose(np.asarray(jaxroll.influence(loaded)), expected, rtol=0, atol=1e-10)
    # The interventions read it: tau divides every score, a^(1 / tau) renormalised per row, and the
    # probability path (the default's `paths`) moves each branch's share by 1 / tau.
    ratios = np.asarray(result.extra["probability_over_value"], dtype=np.float64)
    tempered = jaxroll.interventions.apply_all(loaded, jaxroll.interventions.parse("tau=1.5"))
    expected = _numpy_rollout(offsets, np.clip(result.lambdas, 0, 1), tau=1.5, ratios=ratios)
    np.testing.assert_allclose(np.asarray(jaxroll.influence(tempered)), expected, rtol=0, atol=1e-10)
    plain = _numpy_rollout(offsets, np.clip(result.lambdas, 0, 1), tau=1.5)
    assert np.abs(expected - plain).max() > 1e-6  # the shares matter under a temperature


def _write_texts(path):
    rng = np.random.default_rng(0)
    path.write_text("\n\n".join(" ".join(rng.choice(WORDS, size=N + 6)) for _ in range(3)) + "\n", encoding="utf-8")
    return path


def _profile(path):
    with open(path, newline="") as handle:
        return np.array([float(row["probability"]) for row in csv.DictReader(handle)])


def test_jaxroll_measure_writes_the_offset_config_and_jaxroll_rollout_reads_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(registry, "DENSE_DEFAULT_BYTES", 8 * 2 * N * N - 1)
    model = _llama()
    model.save_pretrained(tmp_path / "model")
    word_level_tokenizer().save_pretrained(tmp_path / "model")
    texts = _write_texts(tmp_path / "docs.txt")
    out = tmp_path / "out"
    code = main([str(item) for item in ["measure", tmp_path / "model", "--texts", texts, "--length", N,
                                        "--samples", 3, "--out", out, "--quiet", "--dtype", "float64"]])
    assert code == 0, capsys.readouterr().err
    with np.load(out / "measurement.npz") as data:
        assert "attention_mean" not in data.files
        offsets, lambdas = data["attention_offsets"], data["lambdas"]
    import json

    assert json.loads((out / "metadata.json").read_text())["stats"] == ["lambda", "influence", "attention_offsets",
                                                                         "paths"]
    code = main(["rollout", str(out / "config.yaml"), "--out", str(tmp_path / "rolled")])
    assert code == 0, capsys.readouterr().err
    np.testing.assert_allclose(_profile(tmp_path / "rolled" / "profile.csv"),
                               _numpy_rollout(offsets, np.clip(lambdas, 0, 1)), rtol=0, atol=1e-10)
    # Below the line (the real one) the same command keeps the dense mean, tabulated over the logit gain where
    # the tables are small too (attention_gains: a gain_table config whose rows at gain 1 are the dense mean).
    monkeypatch.setattr(registry, "DENSE_DEFAULT_BYTES", LINE)
    code = main([str(item) for item in ["measure", tmp_path / "model", "--texts", texts, "--length", N,
                                        "--samples", 3, "--out", tmp_path / "dense", "--quiet"]])
    assert code == 0
    assert "kernel_type: gain_table" in (tmp_path / "dense" / "config.yaml").read_text()

"""The per-sequence-rows prediction (`jaxroll.measure.row_prediction`, ``jaxroll predict-rows``).

Oracles, none of them the code under test:

- a one-layer Llama (rotary, grouped-query attention): its attention computed
  by hand in NumPy float64 from the weights (RMSNorm, projections, rotary
  angles, ``q.k / sqrt(d)``), the logits changed by the documented
  ``z' = s ln n_i (z / tau + kappa log(1 + i - j))``, softmaxed, averaged
  over sequences and heads, rolled out by hand with the gamma-mixed lambda
  (1e-10);
- a two-layer BLOOM (ALiBi): the rows the eager model returns
  (``output_attentions``), changed in NumPy by ``(log alpha - m_h j) / tau +
  (slope / tau) m_h j`` with the slopes ``2^(-8 (h + 1) / H)`` written here,
  averaged and rolled out by hand (1e-10);
- without a change, the prediction is the rollout of the mean kernel: the
  measured ``attention`` statistic (recomputed from q and k by `measure`)
  rolled out by hand with the measured lambdas (1e-10), not the mean of
  per-sequence rollouts (which differs);
- the closed-ratio form (with the probability path's shares): the BLOOM's
  eager rows changed by hand, their path weights
  ``A_ij sqrt((1 - A_ij)^2 + sum_{k != j} A_ik^2)`` by loops, the moved shape
  ``K C'/C``, the formed layer ``((1 - lambda) e_i + lambda B_i) / (1 - lambda
  + lambda W_i)`` and its rollout, all in NumPy float64 (1e-10); with no
  change it is the rollout of the mean kernel (1e-10);
- refusals: one line, exit 2, no --out; the command end to end into
  ``jaxroll effect``, with and without ``paths`` in the baseline.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_tokenizer import run_cli, save_tiny, word_texts  # noqa: E402

from jaxroll.interventions import parse  # noqa: E402
from jaxroll.measure.row_prediction import predict_rows  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py

VOCAB, N, S = 64, 10, 3


def _perturbed(model):
    """Weights scaled so that the attention is far from uniform (as tests/test_intervene_measure.py)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(4.0) if parameter.ndim == 2 else parameter.add_(0.1 * torch.randn_like(parameter))
    return model.double().eval()


def _llama(layers=1):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      hidden_size=16, intermediate_size=24, vocab_size=VOCAB)
    return _perturbed(transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager"))


def _bloom(layers=2):
    torch.manual_seed(0)
    config = transformers.BloomConfig(n_layer=layers, n_head=4, hidden_size=16, vocab_size=VOCAB)
    return _perturbed(transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager"))


def _ids():
    return np.random.default_rng(3).integers(0, VOCAB, size=(S, N))


def _softmax_rows(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def _roll(lambdas, kernels, q=1.0):
    """``(e_{N-1}^T R_T^q ... R_1^q)^{1/q}`` over its sum, ``R_t = (1 - lambda_t) I + lambda_t A_t`` (entries >= 0,
    raised elementwise)."""
    n = kernels.shape[-1]
    v = np.zeros(n)
    v[-1] = 1.0
    for lam, kernel in zip(lambdas[::-1], kernels[::-1]):
        v = v @ ((1 - lam) * np.eye(n) + lam * kernel) ** q
    v = v ** (1.0 / q)
    return v / v.sum()


def _mixed(gamma, lam):
    return gamma * lam / (gamma * lam + 1 - lam)


def _llama_logits(model, ids, ratios=None):
    """``q.k / sqrt(d)`` of the one layer, per sequence and head ``(S, H, N, N)``, by hand in float64; with
    `ratios` ``(H,)`` query head h rotated at positions ``p / r_h`` and the keys it reads at their group's
    first head's ratio (Ms-PoE's convention under grouped-query attention)."""
    weights = {name: p.detach().numpy().astype(np.float64) for name, p in model.named_parameters()}
    config = model.config
    heads, kv, hidden = config.num_attention_heads, config.num_key_value_heads, config.hidden_size
    d = hidden // heads
    h = weights["model.embed_tokens.weight"][ids]  # (S, N, D)
    x = h / np.sqrt((h ** 2).mean(-1, keepdims=True) + config.rms_norm_eps)
    x = x * weights["model.layers.0.input_layernorm.weight"]
    q = (x @ weights["model.layers.0.self_attn.q_proj.weight"].T).reshape(S, N, heads, d)
    k = (x @ weights["model.layers.0.self_attn.k_proj.weight"].T).reshape(S, N, kv, d)
    theta = config.rope_parameters["rope_theta"]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2) / d)
    ratios = np.ones(heads) if ratios is None else np.asarray(ratios, dtype=np.float64)
    groups = heads // kv

    def rotate(t, r):  # t (S, N, H, d), r (H,): positions p / r_h
        angles = (np.arange(N)[:, None, None] / r[None, :, None]) * inv_freq[None, None, :]  # (N, H, d/2)
        cos, sin = (np.concatenate([f(angles)] * 2, -1)[None] for f in (np.cos, np.sin))
        half = t.shape[-1] // 2
        return t * cos + np.concatenate([-t[..., half:], t[..., :half]], -1) * sin

    k = np.repeat(k, groups, axis=2)  # query head h reads key head h // groups
    q, k = rotate(q, ratios), rotate(k, ratios[(np.arange(heads) // groups) * groups])
    return np.einsum("sihd,sjhd->shij", q, k) / np.sqrt(d)


def test_llama_prediction_matches_a_hand_computed_numpy_oracle():
    model, ids = _llama(), _ids()
    tau, kappa, ssmax, gamma, lam = 0.7, 0.5, 1.3, 0.6, np.array([0.37])
    prediction = predict_rows(model, ids, lam, parse(f"tau={tau},kappa={kappa},ssmax_scale={ssmax},gamma={gamma}"),
                              batch_size=2)
    z = _llama_logits(model, ids)
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]
    causal = j <= i
    scale = ssmax * np.log(i + 1.0)
    changed = np.where(causal, scale * (z / tau + kappa * np.log1p(np.maximum(i - j, 0))), -np.inf)
    plain = np.where(causal, z, -np.inf)
    kernel, base_kernel = _softmax_rows(changed).mean((0, 1)), _softmax_rows(plain).mean((0, 1))
    np.testing.assert_allclose(prediction.kernels[0], kernel, rtol=0, atol=1e-10)
    np.testing.assert_allclose(prediction.baseline_kernels[0], base_kernel, rtol=0, atol=1e-10)
    np.testing.assert_allclose(prediction.lambdas, _mixed(gamma, lam), rtol=0, atol=1e-14)
    np.testing.assert_allclose(prediction.profile, _roll(_mixed(gamma, lam), kernel[None]), rtol=0, atol=1e-10)
    np.testing.assert_allclose(prediction.baseline, _roll(lam, base_kernel[None]), rtol=0, atol=1e-10)
    assert np.abs(prediction.profile - prediction.baseline).max() > 1e-3  # the change is visible


def test_a_rotary_rescale_rotates_q_and_k_per_head_as_the_hand_oracle(tmp_path):
    model, ids = _llama(), _ids()
    ratios, tau, lam = [1.0, 2.0, 1.5, 3.0], 0.8, np.array([0.45])
    spec = tmp_path / "ratios.yaml"
    spec.write_text(f"rotary_ratio: {ratios}\ntau: {tau}\n")
    prediction = predict_rows(model, ids, lam, parse(str(spec)), batch_size=2)
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]
    changed = np.where(j <= i, _llama_logits(model, ids, ratios) / tau, -np.inf)
    plain = np.where(j <= i, _llama_logits(model, ids), -np.inf)
    kernel = _softmax_rows(changed).mean((0, 1))
    np.testing.assert_allclose(prediction.kernels[0], kernel, rtol=0, atol=1e-10)
    np.testing.assert_allclose(prediction.baseline_kernels[0], _softmax_rows(plain).mean((0, 1)), rtol=0, atol=1e-10)
    np.testing.assert_allclose(prediction.profile, _roll(lam, kernel[None]), rtol=0, atol=1e-10)


def test_bloom_prediction_changes_the_models_own_rows_by_hand():
    model, ids = _bloom(), _ids()
    tau, slope, lam = 1.5, 0.5, np.array([0.3, 0.55])
    prediction = predict_rows(model, ids, lam, parse(f"tau={tau},slope_scale={slope}"), batch_size=2)
    from jaxroll.measure.precision import full_precision

    with torch.no_grad(), full_precision(model):  # BLOOM's softmax in float64 too (float32 by default)
        attentions = model(input_ids=torch.as_tensor(ids), output_attentions=True).attentions
    heads = model.config.n_head
    m = 2.0 ** (-8.0 * np.arange(1, heads + 1) / heads)  # BLOOM's slopes for a power-of-two head count
    bias = m[:, None, None] * np.arange(N)[None, None, :]  # b_h(j) = m_h j, per key (S broadcast)
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]
    kernels = []
    for alpha in attentions:
        alpha = alpha.double().numpy()
        logits = np.log(np.where(j <= i, alpha, 1.0))
        changed = np.where(j <= i, (logits - bias) / tau + (slope / tau) * bias, -np.inf)
        kernels.append(_softmax_rows(changed).mean((0, 1)))
    kernels = np.stack(kernels)
    np.testing.assert_allclose(prediction.kernels, kernels, rtol=0, atol=1e-10)
    np.testing.assert_allclose(prediction.profile, _roll(lam, kernels), rtol=0, atol=1e-10)


def _path_weights_by_loops(alpha):
    """``C_ij = A_ij sqrt((1 - A_ij)^2 + sum_{k != j} A_ik^2)`` of rows ``(S, H, N, N)``, averaged over s, h."""
    out = np.zeros(alpha.shape[-2:])
    for rows in alpha.reshape(-1, N, N):
        for i in range(N):
            for j in range(N):
                others = sum(rows[i, k] ** 2 for k in range(N) if k != j)
                out[i, j] += rows[i, j] * np.sqrt((1.0 - rows[i, j]) ** 2 + others)
    return out / (alpha.shape[0] * alpha.shape[1])


def _closed_ratio_roll(lambdas, changed, unchanged, weights, changed_weights, shares, gains, q=1.0):
    """The closed-ratio layers ``(T, N, N)`` formed by hand and rolled out: ``P = K C'/C`` (1 where C = 0),
    ``B = (1 - rho) K' + rho sigma_i P_i / |P_i|``, ``R_i = ((1 - lambda) e_i + lambda B_i) / (1 - lambda +
    lambda W_i)``, ``(e_{N-1}^T R_T^q ... R_1^q)^{1/q}`` over its sum."""
    v = np.zeros(N)
    v[-1] = 1.0
    for t in reversed(range(len(lambdas))):
        ratio = np.ones((N, N))
        ratio[weights[t] > 0] = changed_weights[t][weights[t] > 0] / weights[t][weights[t] > 0]
        moved = unchanged[t] * ratio
        branch = (1 - shares[t]) * changed[t] + shares[t] * gains[t][:, None] * moved / moved.sum(-1, keepdims=True)
        lam = lambdas[t]
        layer = ((1 - lam) * np.eye(N) + lam * branch) / (1 - lam + lam * branch.sum(-1))[:, None]
        v = v @ layer ** q
    v = v ** (1.0 / q)
    return v / v.sum()


def _bloom_rows(model, ids):
    """The eager rows ``(T, S, H, N, N)`` float64 of the model, softmax in float64."""
    from jaxroll.measure.precision import full_precision

    with torch.no_grad(), full_precision(model):
        attentions = model(input_ids=torch.as_tensor(ids), output_attentions=True).attentions
    return np.stack([alpha.double().numpy() for alpha in attentions])


def test_the_closed_ratio_form_matches_a_numpy_float64_oracle():
    model, ids = _bloom(), _ids()
    tau, ssmax, gamma, lam, rho = 1.5, 0.8, 0.6, np.array([0.3, 0.55]), np.array([0.35, 0.5])
    prediction = predict_rows(model, ids, lam, parse(f"tau={tau},ssmax_scale={ssmax},gamma={gamma}"),
                              batch_size=2, shares=rho)
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]
    # Under tau and SSMax a = c = s ln(i + 1) / tau: the ALiBi bias is scaled with the content, so the changed
    # logits are a(i) log alpha up to a row constant.
    gain = ssmax * np.log(np.arange(N) + 1.0) / tau
    alphas = _bloom_rows(model, ids)
    changed = np.stack([_softmax_rows(np.where(j <= i, gain[:, None] * np.log(np.where(j <= i, a, 1.0)), -np.inf))
                        for a in alphas])
    weights = np.stack([_path_weights_by_loops(a) for a in alphas])
    changed_weights = np.stack([_path_weights_by_loops(a) for a in changed])
    kernels, unchanged = changed.mean((1, 2)), alphas.mean((1, 2))
    lambdas = _mixed(gamma, lam)
    oracle = _closed_ratio_roll(lambdas, kernels, unchanged, weights, changed_weights, rho, np.stack([gain] * 2))
    assert prediction.form == "closed ratio"
    np.testing.assert_allclose(prediction.weights, weights, rtol=0, atol=1e-12)
    np.testing.assert_allclose(prediction.changed_weights, changed_weights, rtol=0, atol=1e-12)
    np.testing.assert_allclose(prediction.gains, np.stack([gain] * 2), rtol=0, atol=1e-14)
    np.testing.assert_allclose(prediction.profile, oracle, rtol=0, atol=1e-10)
    np.testing.assert_allclose(prediction.rows_profile, _roll(lambdas, kernels), rtol=0, atol=1e-10)
    np.testing.assert_allclose(prediction.baseline, _roll(lam, unchanged), rtol=0, atol=1e-10)
    # The probability path moves the prediction: the form is not today's layer on the rows.
    assert np.abs(prediction.profile - prediction.rows_profile).max() > 1e-3


def test_every_rollout_composes_its_paths_with_the_given_exponent():
    """With a composition exponent q, the baseline, today's layer on the rows and the closed-ratio form each
    compose as the hand-written q-norm rollouts (1e-10, as the q = 1 oracles above), and q moves them."""
    model, ids = _bloom(), _ids()
    tau, q, lam, rho = 1.5, 1.6, np.array([0.3, 0.55]), np.array([0.35, 0.5])
    prediction = predict_rows(model, ids, lam, parse(f"tau={tau}"), batch_size=2, shares=rho, composition=q)
    plain = predict_rows(model, ids, lam, parse(f"tau={tau}"), batch_size=2, shares=rho)
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]
    alphas = _bloom_rows(model, ids)
    changed = np.stack([_softmax_rows(np.where(j <= i, np.log(np.where(j <= i, a, 1.0)) / tau, -np.inf))
                        for a in alphas])
    weights = np.stack([_path_weights_by_loops(a) for a in alphas])
    changed_weights = np.stack([_path_weights_by_loops(a) for a in changed])
    kernels, unchanged = changed.mean((1, 2)), alphas.mean((1, 2))
    gains = np.full((2, N), 1.0 / tau)
    np.testing.assert_allclose(prediction.baseline, _roll(lam, unchanged, q), rtol=0, atol=1e-10)
    np.testing.assert_allclose(prediction.rows_profile, _roll(lam, kernels, q), rtol=0, atol=1e-10)
    np.testing.assert_allclose(prediction.profile, _closed_ratio_roll(lam, kernels, unchanged, weights,
                                                                      changed_weights, rho, gains, q),
                               rtol=0, atol=1e-10)
    assert np.abs(prediction.baseline - plain.baseline).max() > 1e-3
    from jaxroll.errors import ConfigError

    with pytest.raises(ConfigError, match=r"composition.*\[1, 2\]"):
        predict_rows(model, ids, lam, parse(f"tau={tau}"), composition=2.5)


def test_the_closed_ratio_form_without_a_change_is_the_rollout_of_the_mean_kernel():
    model, ids = _bloom(), _ids()
    lam = np.array([0.3, 0.55])
    prediction = predict_rows(model, ids, lam, [], batch_size=2, shares=np.array([0.4, 0.6]))
    oracle = _roll(lam, _bloom_rows(model, ids).mean((1, 2)))
    assert prediction.form == "closed ratio"
    np.testing.assert_allclose(prediction.profile, oracle, rtol=0, atol=1e-10)
    np.testing.assert_allclose(prediction.baseline, oracle, rtol=0, atol=1e-10)


def test_the_closed_ratio_form_under_a_rotary_rescale_as_the_hand_oracle(tmp_path):
    model, ids = _llama(), _ids()
    ratios, tau, lam, rho = [1.0, 2.0, 1.5, 3.0], 0.8, np.array([0.45]), np.array([0.4])
    spec = tmp_path / "ratios.yaml"
    spec.write_text(f"rotary_ratio: {ratios}\ntau: {tau}\n")
    prediction = predict_rows(model, ids, lam, parse(str(spec)), batch_size=2, shares=rho)
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]
    changed = _softmax_rows(np.where(j <= i, _llama_logits(model, ids, ratios) / tau, -np.inf))
    plain = _softmax_rows(np.where(j <= i, _llama_logits(model, ids), -np.inf))
    oracle = _closed_ratio_roll(lam, changed.mean((0, 1))[None], plain.mean((0, 1))[None],
                                _path_weights_by_loops(plain)[None], _path_weights_by_loops(changed)[None], rho,
                                np.full((1, N), 1 / tau))
    np.testing.assert_allclose(prediction.profile, oracle, rtol=0, atol=1e-10)


def test_shares_are_checked_before_any_forward_pass():
    from jaxroll.errors import ConfigError

    with pytest.raises(ConfigError) as error:
        predict_rows(_bloom(), _ids(), np.array([0.3, 0.5]), parse("tau=0.7"), shares=np.array([0.2, 1.0]))
    assert error.value.field == "probability_shares" and "\n" not in str(error.value)


def test_a_per_head_temperature_enters_as_its_heads_mean_gain(tmp_path):
    from jaxroll.measure.row_prediction import logit_gains, row_plan

    model = _bloom()
    spec = tmp_path / "tau.yaml"
    spec.write_text("tau: [0.5, 1.0, 2.0, 4.0]\n")
    plan = row_plan(parse(str(spec)), model.config)
    gains = logit_gains(plan, 2, N, [None, None])
    np.testing.assert_allclose(gains, np.full((2, N), (2.0 + 1.0 + 0.5 + 0.25) / 4), rtol=0, atol=1e-14)


def test_without_a_change_it_is_the_rollout_of_the_mean_kernel():
    from jaxroll.measure import measure
    from jaxroll.theory.sequence_mean import mean_of_rollouts

    model, ids = _llama(layers=2), _ids()
    measured = measure(model, ids, stats=("lambda", "attention"), batch_size=2)
    lambdas = np.asarray(measured.lambdas, dtype=np.float64)
    prediction = predict_rows(model, ids, lambdas, [], batch_size=2)
    oracle = _roll(lambdas, np.asarray(measured.attention_mean, dtype=np.float64))
    np.testing.assert_allclose(prediction.baseline, oracle, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(prediction.profile, prediction.baseline)
    # Not the mean of per-sequence rollouts: averaging the kernels first is a different quantity.
    own = np.stack([np.asarray(measure(model, ids[s:s + 1], stats=("attention",)).attention_mean) for s in range(S)])
    mean_rows = mean_of_rollouts(np.broadcast_to(lambdas, (S, lambdas.size)), own, [N - 1])[0]
    assert np.abs(mean_rows / mean_rows.sum() - oracle).max() > 1e-6


def test_the_batch_size_does_not_change_the_prediction():
    model, ids = _bloom(), _ids()
    changes = parse("tau=0.8,kappa=0.3")
    one = predict_rows(model, ids, np.array([0.4, 0.6]), changes, batch_size=1)
    all_ = predict_rows(model, ids, np.array([0.4, 0.6]), changes, batch_size=S)
    np.testing.assert_allclose(one.profile, all_.profile, rtol=0, atol=1e-13)


@pytest.mark.parametrize("spec, field", [("sinks=4", "--intervene sinks"), ("slope_scale=0.5", "slope_scale")])
def test_interventions_that_map_no_rows_are_refused(spec, field):
    from jaxroll.errors import ConfigError

    with pytest.raises(ConfigError) as error:
        predict_rows(_llama(), _ids(), np.array([0.4]), parse(spec))
    assert error.value.field == field and "\n" not in str(error.value)


# ----------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A tiny Llama saved, its baseline measured (float64) and the same texts measured under tau=1.5."""
    from jaxroll.cli import main

    root = tmp_path_factory.mktemp("rows")
    config = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      hidden_size=32, intermediate_size=64, vocab_size=VOCAB)
    save_tiny(root / "model", config)
    word_texts(root / "texts.txt", [30] * 4)
    common = ["--texts", root / "texts.txt", "--length", 12, "--samples", 4, "--dtype", "float64", "--quiet"]
    for name, extra in (("base", ["--stats", "lambda,influence,attention"]),
                        ("paths", ["--stats", "lambda,influence,attention,paths"]),
                        ("tau", ["--stats", "lambda,influence", "--intervene", "tau=1.5"])):
        assert main([str(a) for a in ["measure", root / "model", *common, *extra, "--out", root / name]]) == 0
    return root


def test_command_end_to_end_into_effect(measured, tmp_path, capsys):
    from jaxroll import io
    from jaxroll.measure.effect import middle_mass

    out = tmp_path / "pred"
    code, stdout, stderr = run_cli(["predict-rows", "--measured", measured / "base", "--intervene", "tau=1.5",
                                    "--out", out, "--json"], capsys)
    assert code == 0, stderr
    record = json.loads(stdout)
    profile, baseline = io.read_profile(out / "profile.csv"), io.read_profile(out / "baseline_profile.csv")
    # The files are the library's prediction on the folder's model, ids and lambdas.
    arrays = np.load(measured / "base" / "measurement.npz")
    model = transformers.AutoModelForCausalLM.from_pretrained(measured / "model", dtype=torch.float64,
                                                              attn_implementation="eager")
    direct = predict_rows(model, arrays["token_ids"], arrays["lambdas"], parse("tau=1.5"))
    np.testing.assert_allclose(profile, direct.profile, rtol=0, atol=1e-12)
    np.testing.assert_allclose(baseline, _roll(arrays["lambdas"], arrays["attention_mean"]), rtol=0, atol=1e-10)
    assert record["middle_mass"]["change"] == pytest.approx(middle_mass(profile) - middle_mass(baseline), abs=1e-12)
    code, stdout, stderr = run_cli(["effect", "--measured", measured / "base", "--measured", measured / "tau",
                                    "--predicted", out / "profile.csv", "--predicted-baseline",
                                    out / "baseline_profile.csv", "--out", tmp_path / "effect", "--resamples", 50,
                                    "--json"], capsys)
    assert code == 0, stderr
    result = json.loads(stdout)
    middle = result["changes"]["middle_mass"]
    assert middle["predicted"] == pytest.approx(middle_mass(profile) - middle_mass(baseline), abs=1e-12)
    # rows.json beside the profile names the predictor and its form
    assert result["predictor"] == f"the per-sequence rows ({json.loads((out / 'rows.json').read_text())['form']})"
    # A baseline measured without paths has no probability_over_value: today's layer on the rows, said so.
    assert record["form"] == "rows" and "no probability_over_value" in record["method"]
    assert record["middle_mass"]["predicted_rows_only"] == record["middle_mass"]["predicted"]


def test_command_with_paths_runs_the_closed_ratio_form(measured, tmp_path, capsys):
    from jaxroll import io

    out = tmp_path / "pred"
    code, stdout, stderr = run_cli(["predict-rows", "--measured", measured / "paths", "--intervene", "tau=1.5",
                                    "--out", out, "--json"], capsys)
    assert code == 0, stderr
    record = json.loads(stdout)
    arrays = np.load(measured / "paths" / "measurement.npz")
    ratio = np.nan_to_num(arrays["probability_over_value"], nan=0.0)
    model = transformers.AutoModelForCausalLM.from_pretrained(measured / "model", dtype=torch.float64,
                                                              attn_implementation="eager")
    direct = predict_rows(model, arrays["token_ids"], arrays["lambdas"], parse("tau=1.5"), shares=ratio / (1 + ratio))
    assert record["form"] == "closed ratio" and "closed ratio" in record["method"]
    np.testing.assert_allclose(record["probability_shares"], ratio / (1 + ratio), rtol=0, atol=1e-15)
    np.testing.assert_allclose(record["logit_gains_last_row"], np.full(ratio.size, 1 / 1.5), rtol=0, atol=1e-15)
    np.testing.assert_array_equal(record["stream_norms"], arrays["stream_norms"])  # what a branch scale would read
    np.testing.assert_allclose(io.read_profile(out / "profile.csv"), direct.profile, rtol=0, atol=1e-12)
    np.testing.assert_allclose(io.read_profile(out / "baseline_profile.csv"), _roll(arrays["lambdas"],
                               arrays["attention_mean"]), rtol=0, atol=1e-10)


def test_command_composes_with_the_baselines_exponent(measured, tmp_path, capsys):
    """A baseline whose config.yaml carries ``composition`` (as jaxroll measure writes a fitted q): every profile
    the command writes composes with it, and rows.json says which q ran; one outside [1, 2] is refused in one
    line."""
    from jaxroll import io

    composed = tmp_path / "composed"
    composed.mkdir()
    for name in ("metadata.json", "measurement.npz"):
        (composed / name).write_bytes((measured / "base" / name).read_bytes())
    config = (measured / "base" / "config.yaml").read_text()
    config = "\n".join(line for line in config.splitlines() if not line.startswith("composition:"))
    (composed / "config.yaml").write_text(config + "\ncomposition: 1.5\n")
    out = tmp_path / "pred"
    code, stdout, stderr = run_cli(["predict-rows", "--measured", composed, "--intervene", "tau=1.5", "--out", out,
                                    "--json"], capsys)
    assert code == 0, stderr
    assert json.loads(stdout)["composition"] == 1.5
    arrays = np.load(composed / "measurement.npz")
    np.testing.assert_allclose(io.read_profile(out / "baseline_profile.csv"),
                               _roll(arrays["lambdas"], arrays["attention_mean"], 1.5), rtol=0, atol=1e-10)
    (composed / "config.yaml").write_text(config + "\ncomposition: 3\n")
    code, _, stderr = run_cli(["predict-rows", "--measured", composed, "--intervene", "tau=1.5", "--out",
                               tmp_path / "refused"], capsys)
    assert code == 2 and stderr.count("\n") == 1 and "composition" in stderr and "[1, 2]" in stderr, stderr
    assert not (tmp_path / "refused").exists()


def _bad(measured, tmp_path):
    """``(argv, words the one line must hold)`` for each refusal."""
    shifted = tmp_path / "shifted"
    shifted.mkdir()
    for name in ("metadata.json", "config.yaml"):
        (shifted / name).write_bytes((measured / "base" / name).read_bytes())
    arrays = dict(np.load(measured / "base" / "measurement.npz"))
    arrays["token_ids"] = arrays["token_ids"][:, :-2]  # N = 10 against the folder's 12
    np.savez(shifted / "measurement.npz", **arrays)
    base = ["predict-rows", "--measured", measured / "base"]
    return [
        (base + ["--intervene", "tau=-1"], ["tau"]),
        (base + ["--intervene", "warmth=2"], ["warmth"]),
        (base + ["--intervene", "sinks=2"], ["--intervene sinks", "allowed"]),
        (["predict-rows", "--measured", tmp_path / "nowhere", "--intervene", "tau=2"], ["--measured", "allowed"]),
        (["predict-rows", "--measured", shifted, "--intervene", "tau=2"], ["N = 10", "N = 12", "allowed"]),
        (["predict-rows", "--measured", measured / "tau", "--intervene", "tau=2"], ["--intervene", "baseline"]),
        (base + ["--intervene", "tau=2", "--model", tmp_path / "nowhere"], ["--model"]),
        (base + ["--intervene", "tau=2", "--max-memory", "1K"], ["--batch-size", "allowed"]),
        (base, ["--intervene"]),
    ]


def test_command_refuses_bad_input_in_one_line_before_out(measured, tmp_path, capsys):
    for argv, words in _bad(measured, tmp_path):
        out = tmp_path / "out"
        code, stdout, stderr = run_cli(argv + ["--out", out], capsys)
        assert code == 2, (argv, stderr)
        assert stderr.startswith("jaxroll: error: ") and stderr.count("\n") == 1, stderr
        assert all(word in stderr for word in words), (words, stderr)
        assert not out.exists(), argv


def test_command_keeps_what_the_user_wrote_without_force(measured, tmp_path, capsys):
    out = tmp_path / "kept"
    out.mkdir()
    (out / "profile.csv").write_text("mine\n")
    code, _, stderr = run_cli(["predict-rows", "--measured", measured / "base", "--intervene", "tau=2", "--out", out],
                              capsys)
    assert code == 2 and "--force" in stderr
    assert (out / "profile.csv").read_text() == "mine\n"

"""Measure -> rollout for models without ALiBi (rotary Llama, learned-position GPT-2).

The oracle is the model itself: its eager attention probabilities
(``output_attentions=True``), averaged over heads and sequences, multiplied as
``R_t = (1 - lambda_t) I + lambda_t A_t`` in plain NumPy float64. Tolerance
1e-10: the rollout is float64 on both sides (a float64 model; eager Llama
takes its softmax in float32, and the config keeps those probabilities as
they are); what differs is the order of summation, ~1e-16 per entry.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers  # noqa: E402
from tiny_tokenizer import WORDS, word_level_tokenizer  # noqa: E402

import jaxroll  # noqa: E402
from tiny_tokenizer import run_cli as _run  # noqa: E402
from jaxroll.measure import measure, write_measurement  # noqa: E402
from jaxroll.measure.precision import full_precision  # noqa: E402

VOCAB = 64


def _config(family):
    if family == "gpt2":
        return transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=VOCAB, n_positions=64,
                                       bos_token_id=0, eos_token_id=0)
    return transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                    hidden_size=32, intermediate_size=64, vocab_size=VOCAB)


def _oracle_profile(model, ids, lambdas):
    with torch.no_grad(), full_precision(model):  # float64 throughout, as measure runs it
        attentions = model(torch.as_tensor(ids), output_attentions=True, use_cache=False).attentions
    kernels = [a.double().mean(dim=(0, 1)).numpy() for a in attentions]  # (N, N) per layer
    n = kernels[0].shape[0]
    row = np.zeros(n)
    row[-1] = 1.0
    for lam, kernel in reversed(list(zip(lambdas, kernels))):
        row = (1 - lam) * row + lam * (row @ kernel)
    return row / row.sum()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_measured_kernel_rollout_equals_the_models_own_attention(family, tmp_path):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(family), attn_implementation="eager")
    model = model.double().eval()
    ids = np.random.default_rng(0).integers(0, VOCAB, (2, 24))
    result = measure(model, ids, stats=("lambda", "attention"))
    write_measurement(result, tmp_path)
    loaded = jaxroll.load_config(tmp_path / "config.yaml")
    assert isinstance(loaded, jaxroll.KernelRolloutModel) and isinstance(loaded.kernel, jaxroll.DenseKernel)
    expected = _oracle_profile(model, ids, result.lambdas)
    np.testing.assert_allclose(jaxroll.influence(loaded), expected, rtol=0, atol=1e-10)
    # A causal prefix: the first n rows of the measured kernels are the kernels at length n, up to
    # the float32 rounding of the model's own softmax (which sums over a different number of keys).
    np.testing.assert_allclose(jaxroll.influence(loaded, 10), _oracle_profile(model, ids[:, :10], result.lambdas),
                               rtol=0, atol=1e-7)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tokenizer = word_level_tokenizer()
    directories = {}
    for family in ("llama", "gpt2"):
        torch.manual_seed(0)
        directory = tmp_path_factory.mktemp(family)
        transformers.AutoModelForCausalLM.from_config(_config(family)).save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        directories[family] = directory
    texts = tmp_path_factory.mktemp("texts") / "docs.txt"
    rng = np.random.default_rng(0)
    texts.write_text("\n\n".join(" ".join(rng.choice(WORDS, size=20)) for _ in range(3)) + "\n", encoding="utf-8")
    return directories, texts


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_measure_rollout_compare_fit_kernel_on_a_saved_model(family, saved, tmp_path, capsys):
    directories, texts = saved
    run = tmp_path / "measure"
    code, _, stderr = _run(["measure", directories[family], "--texts", texts, "--length", 16, "--samples", 2,
                            "--stats", "lambda,influence,attention", "--out", run], capsys)
    assert code == 0, stderr
    assert (run / "config.kernels.npz").is_file()
    code, stdout, stderr = _run(["rollout", run / "config.yaml", "--out", tmp_path / "rollout", "--float64"], capsys)
    assert code == 0, stderr
    assert "config.kernels.npz" in stdout and (tmp_path / "rollout" / "config.kernels.npz").is_file()
    # The rollout equals the NumPy rollout of the measured mean attention (float64 both).
    with np.load(run / "measurement.npz") as data:
        attention, lambdas = data["attention_mean"], data["lambdas"]
    row = np.zeros(16)
    row[-1] = 1.0
    for lam, kernel in reversed(list(zip(lambdas, attention))):
        row = (1 - lam) * row + lam * (row @ kernel)
    profile = jaxroll.read_profile(tmp_path / "rollout" / "profile.csv")
    np.testing.assert_allclose(profile, row / row.sum(), rtol=0, atol=1e-12)
    code, stdout, stderr = _run(["compare", run / "influence.csv", tmp_path / "rollout" / "profile.csv"], capsys)
    assert code == 0, stderr
    assert "wasserstein" in stdout
    # A relative-position fit extends the measured model to lengths it was not measured at.
    code, stdout, stderr = _run(["fit-kernel", run / "config.yaml", "--steps", 300, "--out", tmp_path / "fit",
                                 "--float64"], capsys)
    assert code == 0, stderr
    assert "mean row KL" in stdout and (tmp_path / "fit" / "kernel_fit.csv").is_file()
    code, _, stderr = _run(["rollout", tmp_path / "fit" / "fitted.yaml", "--length", 64, "--out", tmp_path / "far",
                            "--float64"], capsys)
    assert code == 0, stderr
    far = jaxroll.read_profile(tmp_path / "far" / "profile.csv")
    assert far.size == 64 and abs(far.sum() - 1) < 1e-12 and np.all(far >= 0)
    # The measured kernels themselves stop at N = 16: one line, exit 2, nothing written.
    code, _, stderr = _run(["rollout", run / "config.yaml", "--length", 64, "--out", tmp_path / "no"], capsys)
    assert code == 2 and stderr.count("\n") == 1 and "at most the dense kernels' N = 16" in stderr
    assert not (tmp_path / "no").exists()
    # fit-kernel takes any kernel model since wave 3: its kernels are made dense at the config's length.
    # The options of the first fit: its compiled program again (float32's is test_cli_fit's), not a second compile.
    code, _, stderr = _run(["fit-kernel", tmp_path / "fit" / "fitted.yaml", "--steps", 300, "--out", tmp_path / "again",
                            "--float64"], capsys)
    assert code == 0, stderr
    assert (tmp_path / "again" / "fitted.yaml").is_file()

"""The end-to-end validation (validation/pipeline.py) at CI size.

One tiny BLOOM (2 layers, 3 heads: a non-power-of-two ALiBi rule, hidden 48)
is trained for 40 steps on the Python standard library's own source with a
byte-level BPE tokenizer trained here, then measured with ``jaxroll measure``
on held-out files. Only what the theory guarantees and what independent code
can confirm is asserted:

- `crosscheck` (plain PyTorch hooks on other modules, no jaxroll code) gives
  the same lambda_t and influence as ``jaxroll measure``;
- every predicted profile is a probability vector;
- the dense-kernel rollout of the script equals jaxroll's rollout on
  jaxroll's own kernels, and its last entry is the closed-form diagonal
  ``P_T[N-1, N-1] = prod_t (1 - lambda_t + lambda_t A_t[N-1, N-1])`` (causal
  kernels are lower triangular);
- the residual-aware rollout is closer (W1) to the measured influence than
  the attention-only rollout, which drifts mass to the first tokens;
- the fit never ends worse than its starting point (slow: JAX compiles the
  fit; validation/run.py fits every model);
- the ladder (validation/ladder.py): every rung is a probability vector, its
  unrefined rung is the script's dense-kernel rollout, the best combination
  is the lowest W1 among the compatible combinations, its scores are
  `jaxroll.measure.uncertainty.score`'s (intervals ordered, the noise's
  median below its 95 % quantile), out-of-sample scores are finite.

The full run (BLOOM and Llama, 4 layers, trained ~10 minutes each) is
`validation/run.py`; its tables are in docs/refinements.md.
"""

import math

import numpy as np
import pytest
import validation_scripts  # tests/validation_scripts.py

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import jaxroll  # noqa: E402


pipeline = validation_scripts.load("pipeline")
ladder = validation_scripts.load("ladder")

LENGTH = 32
SAMPLES = 8
VOCAB = 320
GEOMETRY = pipeline.Geometry(layers=2, heads=3, hidden=48, length=LENGTH)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    files = pipeline.stdlib_files()
    assert len(files) > 100, "the standard library should have hundreds of .py files"
    # A fixed prefix of the sorted list keeps tokenizing cheap (~300 k characters).
    train_texts, held_texts = pipeline.split_corpus(files[:120])
    kept, total = [], 0
    for text in train_texts:
        kept.append(text)
        total += len(text)
        if total > 300_000:
            break
    directory = tmp_path_factory.mktemp("tokenizer")
    tokenizer = pipeline.train_tokenizer(kept, VOCAB, directory, max_characters=300_000)
    return {"tokenizer": tokenizer, "directory": directory, "train": pipeline.token_stream(tokenizer, kept),
            "held": pipeline.token_stream(tokenizer, held_texts), "held_texts": held_texts}


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    model = pipeline.build_model("bloom", GEOMETRY, len(corpus["tokenizer"]), seed=0)
    curve = pipeline.train(model, corpus["train"], corpus["held"], steps=40, length=LENGTH, batch_size=8,
                           warmup=10, eval_every=40, log=lambda line: None)
    directory = tmp_path_factory.mktemp("bloom")
    model.save_pretrained(directory)
    corpus["tokenizer"].save_pretrained(str(directory))
    texts = pipeline.write_texts(corpus["held_texts"], directory / "held_out.jsonl")
    measured = pipeline.run_measure(directory, texts, directory / "measure", family="bloom", length=LENGTH,
                                    samples=SAMPLES)
    check = pipeline.crosscheck(pipeline.load_float64(directory), measured["token_ids"])
    profiles, details = pipeline.predictions(measured, fit_steps=0)
    from jaxroll.measure.refinements import measure_refinements

    ids = measured["token_ids"]
    ingredients = measure_refinements(pipeline.load_float64(directory), ids, groups=np.arange(len(ids)) % 2)
    result = ladder.run_ladder(ingredients, check["influence"], boots=20)
    return {"curve": curve, "measured": measured, "check": check, "profiles": profiles, "details": details,
            "directory": directory,
            "scores": pipeline.scores(profiles, measured["influence"]), "ingredients": ingredients,
            "ladder": result}


def test_tokenizer_loads_with_autotokenizer_and_is_lossless(corpus):
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(str(corpus["directory"]), local_files_only=True)
    text = corpus["held_texts"][0][:2000]
    ids = loaded(text, add_special_tokens=False)["input_ids"]
    assert len(loaded) == VOCAB
    # Byte-level BPE: decoding the ids gives back the exact text (the oracle is the text itself).
    assert loaded.decode(ids) == text
    assert ids == corpus["tokenizer"](text, add_special_tokens=False)["input_ids"]


def test_training_lowers_the_held_out_loss(trained):
    curve = trained["curve"]
    # At initialisation the loss is about log(vocabulary) (near-uniform logits).
    assert abs(curve[0]["held_out_loss"] - math.log(VOCAB)) < 0.1
    assert curve[-1]["held_out_loss"] < curve[0]["held_out_loss"] - 0.1


def test_crosscheck_agrees_with_jaxroll_measure(trained):
    # Both float64. The cross-check's BLOOM lambda subtracts the block input
    # from the attention module's output (a + x) - x, which costs about
    # eps * ||x|| / ||a|| ~ 1e-13 here; 1e-9 is far below the 1e-6.
    differences = pipeline.crosscheck_differences(trained["measured"], trained["check"])
    assert differences["lambda"] < 1e-9
    assert differences["influence"] < 1e-9
    assert differences["influence_raw"] < 1e-9


@pytest.mark.parametrize("family", pipeline.FAMILIES)
def test_crosscheck_agrees_on_untrained_models(family, tmp_path):
    # Llama is not trained in CI; its hooks (and BLOOM's at initialisation,
    # where lambda_t is tiny) are checked on a seeded initialisation.
    model = pipeline.build_model(family, pipeline.Geometry(layers=2, heads=3, hidden=48, length=32), 128, seed=1)
    model.save_pretrained(tmp_path)
    ids = np.random.default_rng(0).integers(0, 128, (3, 32))
    from jaxroll.measure import measure

    model = pipeline.load_float64(tmp_path)
    result = measure(model, ids, stats="lambda,influence")
    check = pipeline.crosscheck(model, ids)
    measured = {"lambdas": result.lambdas, "influence": result.influence, "influence_raw": result.influence_raw}
    differences = pipeline.crosscheck_differences(measured, check)
    assert max(differences.values()) < 1e-9, differences


def test_measured_profiles_are_valid(trained):
    measured = trained["measured"]
    pipeline.check_profile(measured["influence"], tolerance=1e-12)
    attention = measured["attention_mean"]
    # Causal: nothing above the diagonal; rows sum to 1 within BLOOM's float32 softmax.
    assert np.all(np.triu(attention, k=1) == 0)
    np.testing.assert_allclose(attention.sum(-1), 1.0, atol=1e-6)
    assert np.all((measured["lambdas"] > 0) & (measured["lambdas"] < 1))
    for name, profile in trained["profiles"].items():
        pipeline.check_profile(profile)


def test_dense_kernel_rollout_matches_jaxroll_and_the_diagonal_closed_form(trained):
    measured = trained["measured"]
    model = pipeline.structural_model(measured)
    kernels = np.stack([np.asarray(jaxroll.attention_kernel(model, t, LENGTH)) for t in range(model.num_layers)])
    np.testing.assert_allclose(pipeline.influence_from_kernels(model.lambdas, kernels),
                               np.asarray(jaxroll.influence(model, LENGTH)), rtol=0, atol=1e-12)
    lambdas, attention = measured["lambdas"], measured["attention_mean"]
    p = pipeline.influence_from_kernels(lambdas, attention)
    closed_form = np.prod(1 - lambdas + lambdas * attention[:, -1, -1])
    assert p[-1] == pytest.approx(closed_form, rel=1e-12)
    # The script's NumPy measured-kernel rollout and jaxroll's DenseKernel rollout agree.
    from jaxroll.kernel_types import DenseKernel

    dense = jaxroll.KernelRolloutModel.create(kernel=DenseKernel.create(attention), lambdas=lambdas)
    # jaxroll divides by the row's mass; BLOOM's softmax runs in float32, so the
    # measured rows sum to 1 only within ~1e-7 and the mass differs from 1 by as much.
    np.testing.assert_allclose(p / p.sum(), np.asarray(jaxroll.influence(dense, LENGTH)), rtol=0, atol=1e-12)


def test_residual_aware_beats_attention_only(trained):
    scores = trained["scores"]
    w1 = {name: row["wasserstein"] for name, row in scores.items()}
    assert w1["residual, no content"] < w1["attention-only"]
    assert w1["residual, measured content"] < w1["attention-only"]
    assert w1["residual, measured kernels"] < w1["attention-only, measured kernels"]


@pytest.mark.slow
def test_fit_never_ends_worse_than_its_start(trained):
    profiles, details = pipeline.predictions(trained["measured"], fit_steps=20)
    scores = pipeline.scores(profiles, trained["measured"]["influence"])
    assert details["fit_final_loss"] <= details["fit_initial_loss"] + 1e-12
    assert scores["fitted lambdas"]["wasserstein"] <= scores["residual, measured content"]["wasserstein"] + 1e-9


def test_run_refuses_a_non_empty_out_without_force(tmp_path, capsys):
    run = validation_scripts.load("run")
    (tmp_path / "mine.txt").write_text("keep me")
    figure = tmp_path / "figure.png"
    assert run.main(["--out", str(tmp_path), "--figure", str(figure)]) == 2
    message = capsys.readouterr().err.strip()
    assert message.count("\n") == 0 and "--out" in message and "--force" in message
    assert (tmp_path / "mine.txt").read_text() == "keep me"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["mine.txt"]


def test_ladder_rungs_are_valid_and_the_base_rung_is_the_dense_rollout(trained):
    from jaxroll.measure import uncertainty

    result, measured = trained["ladder"], trained["measured"]
    for row in result["rows"].values():
        pipeline.check_profile(np.asarray(row["profile"]), tolerance=1e-12)
        for low, high in row["interval"].values():
            assert low <= high
        assert all(np.isfinite(value) for value in row["out_of_sample"].values())
        # The ladder's scores are uncertainty.score's (same seed, same draws).
        again = uncertainty.score(np.asarray(row["profile"]), trained["check"]["influence"], B=20, seed=0)
        assert row["wasserstein"] == again.w1 and row["ratio_interval"] == list(again.ratio_interval)
    means = trained["ingredients"].mean()
    # The per-position lambdas average to jaxroll measure's lambda_t; the heads to its mean attention.
    np.testing.assert_allclose(means["lambda_positions"].mean(-1), measured["lambdas"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(means["attention_heads"].mean(1), measured["attention_mean"], rtol=0, atol=1e-12)
    base = np.asarray(result["rows"]["base: measured lambda_t and kernels"]["profile"])
    dense = pipeline.influence_from_kernels(measured["lambdas"], measured["attention_mean"])
    # The ladder divides BLOOM's float32-softmax rows (sums 1 within ~3e-8) by their sums.
    np.testing.assert_allclose(base, dense / dense.sum(), rtol=0, atol=1e-6)
    best = next(row for name, row in result["rows"].items() if name.startswith("best"))
    multi = [w1 for name, w1 in result["all_combinations_w1"].items() if name.count("+") >= 1]
    assert best["wasserstein"] == min(multi)
    assert "gradient+position" not in result["all_combinations_w1"]  # incompatible switches are skipped
    noise = result["noise"]
    assert 0 < noise["median"] <= noise["q95"] and 1 <= noise["n_eff"] <= result["num_sequences"]
    table = ladder.markdown({"bloom": result}, metric="ratio")
    assert "noise of the mean" in table and "p = " in table


def test_rows_study_fitted_lambdas_recover_rows_drawn_from_a_known_mixing():
    """`validation/rows_study.py`'s fitted rung: rows of known lambdas (a dense NumPy float64 product
    ``e_q^T R_T ... R_1`` written here) are reproduced by the study's fit from another start.
    Tolerance 1e-4 on the rows: L-BFGS-B on a sum of |CDF differences| (not smooth at the optimum) stops
    within about 1e-5 of it; a wrong scan direction or a missing normalisation misses by 1e-2."""
    import jax

    from jaxroll.theory.refinements import RefinedRollout
    from jaxroll.theory.rows import query_positions

    rows_study = validation_scripts.load("rows_study")
    rng = np.random.default_rng(3)
    layers, heads, n = 3, 2, 12
    kernels = rng.random((layers, heads, n, n)) * np.tril(np.ones((n, n)))
    kernels /= kernels.sum(-1, keepdims=True)
    queries = query_positions(n, 6)
    mixed = kernels.mean(axis=1)  # uniform head weights
    product = np.eye(n)
    for lam, kernel in zip((0.3, 0.1, 0.5), mixed):  # P_T = R_T ... R_1: R_1 applied first on the right
        product = ((1 - lam) * np.eye(n) + lam * kernel) @ product
    truth = product[queries]
    with jax.enable_x64(True):
        start = RefinedRollout.create(np.array([0.2, 0.2, 0.2]), kernels)
        rows, lambdas = rows_study.fitted_lambdas(start, truth, queries, "all")
    assert rows.shape == truth.shape and np.all(np.isfinite(rows))
    np.testing.assert_allclose(rows.sum(-1), 1.0, atol=1e-12)
    assert np.max(np.abs(rows - truth)) < 1e-4, np.max(np.abs(rows - truth))
    assert lambdas.shape == (layers,) and np.all((lambdas >= 0) & (lambdas <= 1))

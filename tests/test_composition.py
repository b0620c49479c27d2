"""validation/composition.py (the composition test of issue 53): its composition, normalisation and Jacobians.

Oracles written here: NumPy float64 matrix products (``numpy.linalg.multi_dot``) for the rolled-out local
influence; the row sums for the normalisation; ``torch.autograd.functional.jacobian`` of the blocks called
one by one (their arguments captured from a plain forward) for the local and end-to-end Jacobian norms, in
float64, on tiny BLOOM and Llama models built from configurations.
"""


import numpy as np
import pytest
import validation_scripts  # tests/validation_scripts.py


composition = validation_scripts.load("composition")


def _causal_matrices(rng, shape):
    n = shape[-1]
    return rng.random(shape) * np.tril(np.ones((n, n))) + np.eye(n) * 0.1


def test_composition_is_the_last_row_of_the_numpy_product_layer_one_first():
    rng = np.random.default_rng(0)
    layers = _causal_matrices(rng, (3, 4, 7, 7))  # (S, L, N, N)
    got = composition.compose_last_row(layers)
    for s in range(3):
        product = np.linalg.multi_dot([layers[s, t] for t in reversed(range(4))])  # M_4 M_3 M_2 M_1
        np.testing.assert_allclose(got[s], product[-1], rtol=1e-12, atol=0)
    single = composition.compose_last_row(layers[0], row=2)  # no leading axis, another row
    np.testing.assert_allclose(single, np.linalg.multi_dot(list(layers[0, ::-1]))[2], rtol=1e-12, atol=0)


def test_row_normalisation_makes_rows_sum_to_one_and_keeps_their_shape():
    rng = np.random.default_rng(1)
    matrices = _causal_matrices(rng, (2, 3, 6, 6)) * rng.uniform(0.1, 10.0, (2, 3, 6, 1))
    normalised = composition.row_normalise(matrices)
    np.testing.assert_allclose(normalised.sum(-1), 1.0, rtol=0, atol=1e-12)
    # each row divided by its own sum: the row times that sum is the row given
    np.testing.assert_allclose(normalised * matrices.sum(-1, keepdims=True), matrices, rtol=1e-12, atol=0)
    # a product of row-stochastic matrices is row-stochastic: the composed row is a profile
    np.testing.assert_allclose(composition.compose_last_row(normalised).sum(-1), 1.0, rtol=0, atol=1e-12)
    for bad in (np.zeros((2, 2)), -np.eye(2), np.full((2, 2), np.nan)):
        with pytest.raises(ValueError):
            composition.row_normalise(bad)


def test_product_of_means_equals_mean_of_products_when_every_sequence_is_the_same():
    rng = np.random.default_rng(2)
    one = _causal_matrices(rng, (1, 3, 5, 5))
    profiles = composition.composed_profiles(np.repeat(one, 4, axis=0),
                                             transitions=composition.row_normalise(one[0]))
    np.testing.assert_allclose(profiles["rows, per sequence"], profiles["rows, product of means"], rtol=1e-12)
    np.testing.assert_allclose(profiles["norms, per sequence"], profiles["norms, product of means"], rtol=1e-12)
    for t in range(3):  # swapping a layer for itself changes nothing
        np.testing.assert_allclose(profiles[f"R_t -> Mn_t at layer {t + 1}"], profiles["rows, product of means"],
                                   rtol=1e-12)
    # with magnitudes kept, the profile is the NumPy product's last row normalised once
    product = np.linalg.multi_dot(list(one[0, ::-1]))[-1]
    np.testing.assert_allclose(profiles["norms, product of means"], product / product.sum(), rtol=1e-12)


# ---------------------------------------------------------------- the Jacobians, against autograd

VOCAB, HEADS, HIDDEN, LENGTH = 64, 4, 16, 6


def _tiny(family):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if family == "bloom":
        config = transformers.BloomConfig(n_layer=2, n_head=HEADS, hidden_size=HIDDEN, vocab_size=VOCAB)
    else:
        config = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=2,
                                          hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, vocab_size=VOCAB)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():  # larger weights, so that attention and MLP are far from the identity
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.mul_(3.0)
    return model.double().eval()


def _block_jacobians(model, token_ids):
    """Per block, ``(S, N, D, N, D)`` d h'/d h, and the stack's d h_L/d h_0, by calling the blocks one by one."""
    import torch

    from jaxroll.measure.layer_maps import resolve
    from jaxroll.measure.precision import full_precision

    blocks, calls = resolve(model).blocks, []
    handles = [b.register_forward_pre_hook(lambda m, a, k: calls.append((a, k)), with_kwargs=True) for b in blocks]
    with torch.no_grad(), full_precision(model):
        model(input_ids=torch.as_tensor(token_ids), use_cache=False)
    for handle in handles:
        handle.remove()

    def run(t, h):
        args, kwargs = calls[t]
        out = blocks[t](h, *args[1:], **kwargs) if args else blocks[t](**dict(kwargs, hidden_states=h))
        return out[0] if isinstance(out, (tuple, list)) else out

    def stack(h):
        for t in range(len(blocks)):
            h = run(t, h)
        return h

    inputs = [(a[0] if a else k["hidden_states"]).detach() for a, k in calls]
    with full_precision(model):
        local = [torch.autograd.functional.jacobian(lambda h, t=t: run(t, h), inputs[t]) for t in range(len(blocks))]
        whole = torch.autograd.functional.jacobian(stack, inputs[0])
    diagonal = [torch.stack([j[s, :, :, s] for s in range(len(token_ids))]) for j in local + [whole]]
    return diagonal[:-1], diagonal[-1]  # sequences do not mix: keep s -> s


@pytest.mark.parametrize("family", ["bloom", "llama"])
def test_local_and_end_to_end_norms_equal_autograd_and_obey_the_product_bound(family):
    model = _tiny(family)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    token_ids = np.random.default_rng(0).integers(0, VOCAB, (2, LENGTH))
    local, whole = _block_jacobians(model, token_ids)
    got = composition.local_influence(model, token_ids, batch=1)  # (S, L, N, N)
    for t, jacobian in enumerate(local):
        expected = jacobian.pow(2).sum((2, 4)).sqrt().numpy()  # (S, N, N): ||J(i, j)||_F
        assert expected[:, -1].min() > 1e-3  # every key reaches the last query
        np.testing.assert_allclose(got[:, t], expected, rtol=1e-10, atol=1e-12)
    stack = composition.end_to_end(model, token_ids, batch=1)
    np.testing.assert_allclose(stack, whole[:, -1].pow(2).sum((1, 3)).sqrt().numpy(), rtol=1e-10, atol=1e-12)
    # the norm of the product is at most the product of the norms, entry by entry (triangle, submultiplicative)
    assert np.all(stack <= composition.compose_last_row(got) * (1 + 1e-12))

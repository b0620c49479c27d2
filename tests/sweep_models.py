"""The small models of tests/test_sweep.py, shared with its subprocess worker."""

import jaxroll


def content_model(mask="causal", window=None):
    """Layer-dependent content and weights: only the vmap path applies."""
    return jaxroll.RolloutModel.create(
        num_layers=3, num_heads=2, lambdas=[0.3, 0.5, 0.7], alibi_slopes=[0.4, 0.1],
        diagonal_scores=[[1.0, -0.5], [0.2, 0.1], [0.0, 2.0]], head_weights=[[1.0, 3.0]],
        mask=mask, window=window, sequence_length=24)


def uniform_model(mask="causal", window=None):
    """The same kernel in every layer: the Krylov path."""
    return jaxroll.RolloutModel.create(num_layers=6, num_heads=4, lambdas=0.5,
                                       diagonal_scores=[0.5, -1.0, 0.0, 2.0],
                                       mask=mask, window=window, sequence_length=24)

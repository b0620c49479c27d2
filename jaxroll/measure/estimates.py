"""Estimated device memory and time per sequence of `jaxroll measure` on a large model.

Estimates from the model's sizes, not measurements. For P parameters, L
blocks, hidden size D, H heads, N tokens, a dtype of b bytes (2 for
bfloat16) and per-block activation checkpointing (the default):

- weights: ``b P``;
- activations: the checkpointed block inputs ``b L N D``, plus one block's
  working set during its recompute and backward, about ``16 H N^2`` (eager
  attention scores, float32 softmax, probabilities and their gradients) and
  ``32 N D`` (projections and MLP), plus ``8 H N^2`` when a statistic
  reads the probabilities in float64 (``attention``, ``sinks``);
- work: forward ``2 P N + 4 L N^2 D`` floating-point operations (the
  matrix products with the weights, ``q k^T`` and ``p v``); the influence
  pass runs the forward, recomputes it block by block, and back-propagates
  to the input embeddings only (about one forward more, no weight
  gradients): about 3 forwards;
- time: work / throughput, where throughput is what one device sustains
  (an assumption; default 125e12 FLOP/s, 40 % of an A100's bfloat16 peak).
  Under ``--device-map auto`` the layers run one device after another, so
  a model spread over k devices runs at one device's speed, not k.

The float64 sums (influence per sequence, lambdas, ...) live on the host:
`jaxroll.measure.stats_bytes`.
"""

from __future__ import annotations

__all__ = ["estimate", "PAPER_MODELS"]

# From each model's published config.json (num_parameters rounded as published).
PAPER_MODELS = {
    "BLOOM-176B": {"num_parameters": 176.2e9, "num_layers": 70, "hidden_size": 14336, "num_heads": 112},
    "MPT-30B": {"num_parameters": 29.96e9, "num_layers": 48, "hidden_size": 7168, "num_heads": 64},
    "Falcon-7B": {"num_parameters": 6.92e9, "num_layers": 32, "hidden_size": 4544, "num_heads": 71},
}
"""The paper's measured models, from their published ``config.json``: parameters, layers, hidden size, heads."""


def estimate(*, num_parameters: float, num_layers: int, hidden_size: int, num_heads: int, length: int,
             bytes_per_parameter: int = 2, throughput: float = 125e12, probabilities: bool = False) -> dict:
    """``{"weights_bytes", "activation_bytes", "device_bytes", "flops", "seconds"}`` per sequence (see module doc)."""
    p, layers, d, h, n, b = num_parameters, num_layers, hidden_size, num_heads, length, bytes_per_parameter
    weights = b * p
    activations = b * layers * n * d + 16 * h * n * n + 32 * n * d + (8 * h * n * n if probabilities else 0)
    forward = 2 * p * n + 4 * layers * n * n * d
    flops = 3 * forward
    return {"weights_bytes": weights, "activation_bytes": activations, "device_bytes": weights + activations,
            "flops": flops, "seconds": flops / throughput}

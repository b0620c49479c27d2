"""The gains of the norms around attention: the RMSNorm after W_O, and the norm in front of attention.

`post_norm_gain` reads ``(g, eps)`` of the RMSNorm that follows W_O (Gemma 2/3,
OLMo 2; the refinements ``norm`` and ``heads``). The rest of this module is
about the norm in front of each block's attention, per family: where it is
and its gain ``1 / sigma(j)``.

The refinement ``input_norm`` (`jaxroll.theory.refinements`) needs, per
block t and source position j, the factor by which the attention input norm
``LN_t`` scales the gradient at j: its Jacobian is ``(1 / sigma_t(j))``
times a projection (and the gain), with

    LayerNorm: sigma(j) = sqrt(var(x_j) + eps)       (variance over the D features, biased)
    RMSNorm:   sigma(j) = sqrt(mean(x_j^2) + eps)

(Gemma's ``1 + weight`` and OLMo's or Llama's ``weight`` are the gain, not
part of sigma). Which form a module computes is read from it: a
``torch.nn.LayerNorm`` is a LayerNorm; anything else must pass the RMSNorm
check of `post_norm_gain` on a probe vector.

Where the attention reads the block input without a norm (OLMo 2 puts its
norms after the sub-layers), the gain is 1 at every position. Post-LN OPT
(``do_layer_norm_before=False``) normalises after the residual add, which
the rollout's identity path does not describe: it is refused.
"""

from __future__ import annotations

import math

from ..errors import ConfigError

__all__ = ["post_norm_gain", "input_norm_module", "norm_kind", "input_gains"]

def post_norm_gain(norm, hidden: int, family: str = "") -> tuple[torch.Tensor, float]:
    """``(g (D,), eps)`` of the RMSNorm after W_O: ``norm(o) = g * o / sqrt(mean(o^2) + eps)``.

    ``g`` is read from the module itself (``norm(1) sqrt(1 + eps)``: Gemma's
    ``1 + weight``, OLMo 2's ``weight``), in float64 whatever the model's
    dtype; the form is checked on a probe vector.

    Raises:
        ConfigError: the module has no ``eps`` / ``variance_epsilon`` or is not an RMSNorm of that form.
    """
    import torch

    from .precision import Float64Mode

    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
    weight = getattr(norm, "weight", None)
    if eps is None or weight is None:
        raise ConfigError(f"architecture: {family!r}: the norm after W_O ({type(norm).__name__}) has no weight and "
                          "eps; allowed: an RMSNorm")
    with torch.no_grad(), Float64Mode():
        ones = torch.ones(hidden, dtype=torch.float64, device=weight.device)
        gain = norm.forward(ones).double() * math.sqrt(1.0 + float(eps))  # forward: no hooks fire
        probe = torch.linspace(-1.0, 2.0, hidden, dtype=torch.float64, device=weight.device)
        expected = gain * probe / torch.sqrt((probe * probe).mean() + eps)
        if not torch.allclose(norm.forward(probe).double(), expected, rtol=1e-6, atol=1e-12):
            raise ConfigError(f"architecture: {family!r}: the norm after W_O ({type(norm).__name__}) is not "
                              "g * o / sqrt(mean(o^2) + eps); allowed: an RMSNorm")
    return gain.cpu(), float(eps)


def input_norm_module(block, layer_map, config=None):
    """The attention input norm of `block` (the first of ``layer_map.input_norm`` it has), or None where the
    attention reads the block input (an empty ``input_norm``).

    Raises:
        ConfigError: post-LN OPT, or a block without the named norm.
    """
    family, names = layer_map.name, layer_map.input_norm
    if family == "opt" and config is not None and not getattr(config, "do_layer_norm_before", True):
        raise ConfigError("input_norm_gains: OPT with do_layer_norm_before=False normalises after the residual add; "
                          "allowed: a pre-norm model")
    if not names:
        return None
    for name in names:
        if hasattr(block, name):
            return getattr(block, name)
    raise ConfigError(f"input_norm_gains: {family!r} block has no {' or '.join(names)}; allowed: a block with "
                      "its attention input norm")


def norm_kind(module, hidden: int, family: str = "") -> tuple[str, float]:
    """``("layer", eps)`` for a LayerNorm, ``("rms", eps)`` for an RMSNorm (checked on a probe vector)."""
    import torch

    if isinstance(module, torch.nn.LayerNorm):
        return "layer", float(module.eps)
    _, eps = post_norm_gain(module, hidden, family)
    return "rms", eps


def input_gains(tensor, kind: str, eps: float):
    """``1 / sigma(j)`` of a norm's input ``(..., N, D)``, in float64: ``(..., N)``."""
    import torch

    x = tensor.detach().double()
    if kind == "layer":
        spread = x.var(dim=-1, unbiased=False)
    else:
        spread = (x * x).mean(dim=-1)
    return 1.0 / torch.sqrt(spread + eps)

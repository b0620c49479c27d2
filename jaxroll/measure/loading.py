"""Loading a model from a local directory: no network, one-line errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import ConfigError
from .layer_maps import layer_map_for

__all__ = ["load_model", "inspect_model", "ModelPlan", "DTYPES", "DEVICES", "attention_implementation"]

DTYPES = ("bfloat16", "float16", "float32", "float64")
"""The dtypes `load_model` loads a model in (``--dtype``)."""
DEVICES = ("cpu", "cuda", "auto")
"""Where `load_model` puts the model (``--device``): the CPU, a CUDA device, or the best available."""


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    """What a model's ``config.json`` decides, read without the weights.

    Attributes:
        config: the transformers config.
        layer_map: the architecture's `LayerMap` name (``model_type``).
        position: ``alibi``, ``rope`` or ``learned``.
        num_layers, num_heads, hidden_size, vocab_size: from the config.
        allowed: the statistics this architecture can give.
        default: the default ``--stats`` at an unknown length (`default_stats`
            without N: ``attention_offsets`` for a model without ALiBi);
            ``jaxroll measure`` asks `default_stats` at its ``--length``.
        max_length: the longest N the model accepts (None: unbounded here).
    """

    config: object
    layer_map: str
    position: str
    num_layers: int
    num_heads: int
    hidden_size: int
    vocab_size: int
    allowed: tuple
    default: tuple
    max_length: int | None


def _read_config(directory):
    from transformers import AutoConfig

    path = Path(directory)
    if not path.exists():
        raise ConfigError(f"model {directory}: no such directory (models load from local files only)")
    if not path.is_dir():
        raise ConfigError(f"model {directory}: not a directory; allowed: a directory written by save_pretrained")
    try:
        return AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        raise ConfigError(f"model {directory}: no loadable config.json ({_first_line(error)})") from None


def inspect_model(directory) -> ModelPlan:
    """The `ModelPlan` of the model saved in `directory`, from ``config.json`` only.

    ``AutoConfig.from_pretrained(directory, local_files_only=True)``: no
    weights are read, so every refusal that the architecture decides
    (no layer map, content for a rotary model, N beyond MPT's
    ``max_seq_len``, the memory of the requested statistics) comes in
    seconds, before a model of any size loads.

    Raises:
        ConfigError: a missing directory, no config, no layer map.
    """
    from .registry import allowed_stats, default_stats

    config = _read_config(directory)
    layer_map = layer_map_for(type("Unloaded", (), {"config": config})())
    num_heads = int(getattr(config, layer_map.num_heads))
    num_layers = int(getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
                     or getattr(config, "n_layers", 0))
    max_length = int(config.max_seq_len) if layer_map.name == "mpt" else None
    return ModelPlan(config=config, layer_map=layer_map.name, position=layer_map.position, num_layers=num_layers,
                     num_heads=num_heads, hidden_size=int(getattr(config, layer_map.hidden_size)),
                     vocab_size=int(getattr(config, "vocab_size", 0) or 0),
                     allowed=allowed_stats(layer_map.position), default=default_stats(layer_map.position),
                     max_length=max_length)


def attention_implementation(config, stats, falcon_alibi: str = "once") -> str:
    """``"sdpa"`` unless a statistic in `stats` reads the attention probabilities: then ``"eager"``.

    lambda, content, qk and influence read the residual stream, the
    projections and the gradient, never the probabilities, so the model's
    efficient attention (``F.scaled_dot_product_attention``: no ``(N, N)``
    tensor per head on the flash and memory-efficient kernels) serves them.
    ``attention``, ``sinks``, ``attention_offsets``, ``attention_heads`` and
    ``norm_kernels`` recompute their rows in chunks from q and k
    (`jaxroll.measure.attention_rows`; on an eager model too, where the
    family's logit is stated exactly), so they too run on ``"sdpa"``.
    ``"eager"`` for registered statistics that read probabilities without
    ``observe_rows``, for Falcon's ``doubled`` ALiBi (its
    eager path), and for architectures whose transformers class has no SDPA
    path (BLOOM and MPT build their ALiBi scores themselves).
    """
    from transformers import AutoModelForCausalLM

    from .registry import registered

    # attention and statistics with `observe_rows` get their rows recomputed from q, k.
    reading = any(name in registered() and registered()[name].needs_eager and registered()[name].observe_rows is None
                  for name in stats)
    if reading or (getattr(config, "model_type", None) == "falcon" and falcon_alibi == "doubled"):
        return "eager"
    # A rotary family whose recomputed rows are not checked (no `rotary` module in its map) reads them eagerly.
    from .layer_maps import LAYER_MAPS

    layer_map = LAYER_MAPS.get(getattr(config, "model_type", None))
    rows = "attention" in stats or any(name in registered() and (registered()[name].needs_eager or
                                       "probabilities" in registered()[name].hooks) for name in stats)
    if rows and layer_map is not None and layer_map.position == "rope" and layer_map.rotary is None:
        return "eager"
    try:
        model_class = AutoModelForCausalLM._model_mapping[type(config)]
    except (KeyError, ValueError):
        return "eager"
    return "sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager"


def resolve_device(device: str) -> str:
    """``cpu``, ``cuda`` or ``auto`` (cuda when available) as a torch device string."""
    import torch

    if device not in DEVICES:
        raise ConfigError(f"--device: got {device!r}; allowed: one of {', '.join(DEVICES)}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: torch sees no CUDA device; allowed: cpu, or auto")
    return device


def load_model(directory, *, dtype: str = "float32", attn_implementation: str = "eager", device: str = "cpu",
               device_map: str | None = None):
    """``AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)``.

    `dtype` is one of ``bfloat16, float16, float32, float64``. Eager
    attention by default: it returns the attention probabilities and is the
    path on which Falcon's bias variant can be chosen (see
    `jaxroll.measure.measure`); `attention_implementation` says when
    ``"sdpa"`` serves the requested statistics (``jaxroll measure`` asks it).
    `device` is ``cpu``, ``cuda`` or ``auto``; ``device_map="auto"`` spreads
    a model that does not fit one device over every device (and the CPU)
    with Hugging Face accelerate (``pip install accelerate``; `device` is
    then ignored).

    Raises:
        ConfigError: a missing directory, one without a model, a model id that
            is not available locally, accelerate missing for a device map.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise ConfigError(f"--dtype: got {dtype!r}; allowed: one of {', '.join(DTYPES)}")
    if device_map not in (None, "auto"):
        raise ConfigError(f"--device-map: got {device_map!r}; allowed: auto")
    if device_map is not None:
        try:
            import accelerate  # noqa: F401
        except ImportError:
            raise ConfigError("--device-map auto: needs accelerate; pip install accelerate "
                              "(or jaxroll[measure])") from None
    target = resolve_device(device)
    path = Path(directory)
    config = _read_config(directory)
    # Before the weights: an architecture without a map fails fast.
    layer_map_for(type("Unloaded", (), {"config": config})())
    from transformers.utils import logging

    bar = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # stderr keeps to one line per error
    try:
        placement = {"device_map": device_map} if device_map is not None else {}
        model = AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, dtype=getattr(torch, dtype), attn_implementation=attn_implementation,
            **placement)
        if device_map is None and target != "cpu":
            model = model.to(target)
    except (OSError, ValueError, KeyError) as error:
        raise ConfigError(
            f"model {directory}: cannot load a causal LM of type {config.model_type!r} ({_first_line(error)})"
        ) from None
    finally:
        if bar:
            logging.enable_progress_bar()
    return model


def _first_line(error) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__

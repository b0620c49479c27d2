"""Loading a model from a local directory: no network, one-line errors."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .layer_maps import layer_map_for

__all__ = ["load_model", "DTYPES"]

DTYPES = ("bfloat16", "float32", "float64")
"""The dtypes `load_model` loads a model in (``--dtype``)."""


def load_model(directory, *, dtype: str = "float32", attn_implementation: str = "eager"):
    """``AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)``.

    `dtype` is one of ``bfloat16, float32, float64``. Eager attention by
    default: it returns the attention probabilities and is the path on which
    Falcon's bias variant can be chosen (see `jaxroll.measure.measure`).

    Raises:
        ConfigError: a missing directory, one without a model, a model id that
            is not available locally.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if dtype not in DTYPES:
        raise ConfigError(f"--dtype: got {dtype!r}; allowed: one of {', '.join(DTYPES)}")
    path = Path(directory)
    if not path.exists():
        raise ConfigError(f"model {directory}: no such directory (models load from local files only)")
    if not path.is_dir():
        raise ConfigError(f"model {directory}: not a directory; allowed: a directory written by save_pretrained")
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        raise ConfigError(f"model {directory}: no loadable config.json ({_first_line(error)})") from None
    # Before the weights: an architecture without a map fails fast.
    layer_map_for(type("Unloaded", (), {"config": config})())
    from transformers.utils import logging

    bar = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # stderr keeps to one line per error
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, dtype=getattr(torch, dtype), attn_implementation=attn_implementation)
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

"""Small rollouts in NumPy float64, without JAX: what a one-off call at small N is answered with.

A process that runs one small rollout spends most of its time importing JAX
(0.7-1 s on a 2-core CPU) and tracing, not computing: the paper authors'
64-token example (N = 64, T = 64, one head) is 64 products of a 64 x 64
matrix. This module reads the same configuration files as `jaxroll.io`
(``load_config``) and rolls them out with NumPy alone, so `jaxroll rollout`
on a small problem, and `jaxroll effect`'s rollout of a baseline's
config.yaml, never import JAX.

The rollout is the theory's, written out densely (arXiv 2602.16837): layer t
has the kernel ``A_t`` (rows sum to 1), ``R_t = (1 - lambda_t) I + lambda_t
A_t``, ``P_T = R_T ... R_1``, and the rows ``e_q^T P_T`` are formed from the
left, ``v <- (1 - lambda_t) v + lambda_t v A_t`` for t = T..1, in O(T n^2)
after the kernels are formed. Kernels:

- ALiBi + content (the paper's schema, `jaxroll.engine.alibi.AlibiKernel`):
  ``A_t = sum_h w_h rowsoftmax(s_h) / sum_h w_h`` with ``s_h(i, j) = (-m_h (i -
  j) + d_h [i == j] + b_h) / tau`` on the mask's allowed entries, each row's
  largest allowed score subtracted before exponentiating (as `layer_kernel`).
  A head kernel is formed once for each distinct ``(m, d, b)`` and a layer
  kernel once for each distinct layer, so a configuration that repeats one
  layer (the example, the no-content files) forms one ``(n, n)`` matrix.
- a measured mean kernel (``kernel_config.kernel_type: dense``,
  `jaxroll.engine.dense.DenseKernel`): its ``(T, N, N)`` array, the
  ``(n, n)`` leading block at ``n <= N``.

Anything else (another kernel type, a value the checks refuse) gives None
from `read_config`: the caller then takes the JAX path, whose refusal is the
one the user sees. So a file is never accepted here that `jaxroll.io.load_config`
refuses (tests/test_latency.py feeds both the refusals of the schema's tests).

`is_small` decides where NumPy is the faster path: at most `SMALL_ENTRIES`
kernel entries formed (``(distinct heads + layers) n^2``), about 0.1 s of
NumPy on a 2-core CPU, under the 0.7 s that importing JAX alone costs.
Results equal `jaxroll.influence_with_mass` in float64 to 1e-12 (relative to
the profile's largest entry) on the 33 published rollout configurations.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from . import memory, schedules
from ._checks import as_float_array, check_positive_int, check_range, per_layer_and_head
from .engine.config import check_keys, compact, nested_array, read_kernel_file
from .errors import ConfigError

__all__ = ["SMALL_ENTRIES", "SmallModel", "read_config", "from_mapping", "is_small", "influence_with_mass",
           "rollout_rows", "config_of", "save_config", "working_bytes"]

SMALL_ENTRIES = 1 << 23
"""Most kernel entries (``(distinct head kernels + layers) n^2``) a NumPy rollout forms (`is_small`): about
0.1 s on a 2-core CPU (benchmarks/latency.py), where JAX's import alone takes 0.7 s."""

# The paper's schema (`jaxroll.engine.alibi`): its sections and masks; the model's keys (`jaxroll.schema`).
_MASKS = {"causal": "causal", "full": "full", "sliding_window": "sliding"}
_SECTIONS = {"mask_config": {"mask_type", "window_size"},
             "attention_config": {"num_heads", "alibi_slopes", "head_weights", "softmax_temperature"},
             "content_config": {"diagonal_scores", "base_scores"}}
_MODEL_KEYS = {"sequence_length", "num_layers", "lambda_schedule_config", "save_dir"}
_SCHEDULES = {"constant": {"schedule_type", "lambda_const"}, "power_decay": {"schedule_type", "lambda_0", "beta"},
              "custom": {"schedule_type", "lambdas_custom"}}
_DENSE_TOLERANCE = 1e-6  # rows of a measured kernel sum to 1 within this (`DenseKernel.ROW_SUM_TOLERANCE`)


@dataclasses.dataclass(frozen=True, eq=False)
class SmallModel:
    """A rollout configuration as NumPy float64 arrays (what `read_config` returns).

    ``lambdas (T,)``; ``sequence_length`` N; ``kind`` ``"alibi"`` (``alibi_slopes``,
    ``diagonal_scores``, ``base_scores``, ``head_weights``: ``(T, H)``;
    ``temperature``; ``mask``, ``window``) or ``"dense"`` (``kernels (T, N, N)``,
    ``kernel_file`` the npz it was read from).
    """

    lambdas: np.ndarray
    sequence_length: int
    kind: str
    alibi_slopes: np.ndarray | None = None
    diagonal_scores: np.ndarray | None = None
    base_scores: np.ndarray | None = None
    head_weights: np.ndarray | None = None
    temperature: float = 1.0
    mask: str = "causal"
    window: int | None = None
    kernels: np.ndarray | None = None
    composition = None  # q = 1 only: a config with ``composition`` is not read here (`from_mapping`), JAX rolls it out

    @property
    def num_layers(self) -> int:
        return int(self.lambdas.size)

    @property
    def num_heads(self) -> int:
        return 1 if self.kind == "dense" else int(self.alibi_slopes.shape[1])

    def with_length(self, n: int) -> "SmallModel":
        """The model at length `n` (``--length``); a dense kernel is defined there only where `check_length` says."""
        return dataclasses.replace(self, sequence_length=int(n))

    def check_length(self, n: int) -> bool:
        """Whether the kernel is defined at `n` (a dense kernel: ``n <= N`` when causal, else ``n == N``)."""
        if self.kind != "dense":
            return True
        size = self.kernels.shape[-1]
        return n <= size if not np.triu(self.kernels, k=1).any() else n == size


def read_config(path) -> SmallModel | None:
    """The configuration file at `path` as a `SmallModel`, or None where this module does not take it.

    None for another kernel type, a file that cannot be read or any value
    `jaxroll.io.load_config` would refuse: the caller then loads it with JAX,
    which says why in one line.
    """
    from .io import read_yaml

    try:
        return from_mapping(read_yaml(path), Path(path).parent)
    except (ConfigError, OSError, ValueError, TypeError, KeyError, RecursionError):
        return None


def from_mapping(config, directory=None) -> SmallModel:
    """A parsed configuration (`jaxroll.io.read_yaml`) as a `SmallModel`; `ConfigError` where it is not one
    this module takes (the JAX path's message is the one to show: see `read_config`)."""
    if not isinstance(config, dict):
        raise ConfigError("config: not a mapping")
    kernel_config = config.get("kernel_config")
    allowed = _MODEL_KEYS | (set(_SECTIONS) if kernel_config is None else {"kernel_config"})
    check_keys("", config, allowed, required=(_MODEL_KEYS - {"save_dir"}) | ({"kernel_config"} if kernel_config
                                                                          is not None else {"attention_config"}))
    num_layers = check_positive_int("num_layers", config["num_layers"])
    n = config["sequence_length"]
    if n is None:
        raise ConfigError("sequence_length: null")
    n = check_positive_int("sequence_length", n)
    lambdas = _schedule(config["lambda_schedule_config"], num_layers)
    if kernel_config is not None:
        kernels = _dense_kernels(kernel_config, num_layers, directory)
        model = SmallModel(lambdas=lambdas, sequence_length=n, kind="dense", kernels=kernels)
        if not model.check_length(n):
            raise ConfigError("sequence_length: outside the dense kernel")
        return model
    return SmallModel(lambdas=lambdas, sequence_length=n, kind="alibi", **_alibi_fields(config, num_layers))


def _schedule(schedule, num_layers: int) -> np.ndarray:
    """`jaxroll.schema.schedule_from_config`'s lambdas, through the same `jaxroll.schedules` functions."""
    kind = schedule.get("schedule_type") if isinstance(schedule, dict) else None
    if not isinstance(kind, str) or kind not in _SCHEDULES:
        raise ConfigError("lambda_schedule_config.schedule_type")
    check_keys("lambda_schedule_config", schedule, _SCHEDULES[kind], required=_SCHEDULES[kind])
    if kind == "constant":
        value = as_float_array("lambda_const", schedule["lambda_const"])
        if value.shape != ():
            raise ConfigError("lambda_const: one number")
        check_range("lambda_const", value, 0.0, 1.0)
        return np.asarray(schedules.constant(schedule["lambda_const"], num_layers), dtype=np.float64)
    if kind == "power_decay":
        value = as_float_array("lambda_0", schedule["lambda_0"])
        if value.shape != ():
            raise ConfigError("lambda_0: one number")
        check_range("lambda_0", value, 0.0, 1.0, low_open=True)
        return np.asarray(schedules.power_decay(schedule["lambda_0"], schedule["beta"], num_layers), dtype=np.float64)
    values = np.asarray(schedules.custom(schedule["lambdas_custom"]), dtype=np.float64)
    if values.shape != (num_layers,):
        raise ConfigError("lambdas_custom: length")
    return values


def _alibi_fields(config, num_layers: int) -> dict:
    """`AlibiKernel.from_config` and `create`'s checks, on the paper's three sections, as NumPy fields."""
    mask_config, attention, content = (config.get(name) or {} for name in _SECTIONS)
    for section, value in (("mask_config", mask_config), ("attention_config", config["attention_config"]),
                           ("content_config", content)):
        check_keys(section, value, _SECTIONS[section],
                   required={"num_heads", "alibi_slopes"} if section == "attention_config" else ())
    num_heads = check_positive_int("num_heads", attention["num_heads"])
    # Five (T, H) float64 arrays, refused when they cannot be allocated (as `AlibiKernel.create`).
    memory.check_fits(5 * 8 * num_layers * num_heads, "num_layers x num_heads")
    mask_type = mask_config.get("mask_type", "causal")
    if not isinstance(mask_type, str) or mask_type not in _MASKS:
        raise ConfigError("mask_config.mask_type")
    window = mask_config.get("window_size")
    mask = _MASKS[mask_type]
    if mask == "sliding":
        window = check_positive_int("window", window)
    slopes = attention["alibi_slopes"]
    weights = nested_array("head_weights", attention.get("head_weights"))
    given = {"alibi_slopes": nested_array("alibi_slopes", slopes),
             "diagonal_scores": nested_array("diagonal_scores", content.get("diagonal_scores", [[0.0]])),
             "base_scores": nested_array("base_scores", content.get("base_scores", [[0.0]])),
             "head_weights": np.full(num_heads, 1.0 / num_heads) if weights is None else weights}
    if given["alibi_slopes"] is None:
        raise ConfigError("alibi_slopes: null")
    fields = {name: per_layer_and_head(name, value, num_layers, num_heads) for name, value in given.items()}
    temperature = as_float_array("temperature", attention.get("softmax_temperature", 1.0))
    if temperature.shape != ():
        raise ConfigError("temperature: one number")
    check_range("temperature", temperature, 0.0, None, low_open=True)
    check_range("alibi_slopes", fields["alibi_slopes"], 0.0, None)
    check_range("diagonal_scores", fields["diagonal_scores"])
    check_range("base_scores", fields["base_scores"])
    check_range("head_weights", fields["head_weights"], 0.0, None)
    if not (fields["head_weights"].sum(axis=-1) > 0).all():
        raise ConfigError("head_weights: a layer of zeros")
    return {**fields, "temperature": float(temperature), "mask": mask, "window": window if mask == "sliding" else None}


def _dense_kernels(section, num_layers: int, directory) -> np.ndarray:
    """`DenseKernel.from_config`'s ``(T, N, N)`` array, checked as `DenseKernel.create` checks it."""
    check_keys("kernel_config", section, {"kernel_type", "file"}, required={"file"})
    if section.get("kernel_type") != "dense":
        raise ConfigError("kernel_config.kernel_type: not dense")
    kernels = read_kernel_file(section["file"], "kernels", directory)
    if kernels.ndim != 3 or kernels.shape[0] != num_layers or kernels.shape[1] != kernels.shape[2] or not kernels.size:
        raise ConfigError("kernel_config.file: shape")
    check_range("kernels", kernels, 0.0, None)
    if (np.abs(kernels.sum(axis=-1) - 1.0) > _DENSE_TOLERANCE).any():
        raise ConfigError("kernel_config.file: rows")
    return kernels


def config_of(model: SmallModel) -> dict:
    """`model` in the rollout YAML schema, as `jaxroll.schema.config_from_model` writes an ALiBi model
    (`AlibiKernel.to_config`; a constant schedule when every lambda is equal, else custom)."""
    if model.kind != "alibi":
        raise ConfigError("config_of: an ALiBi model only")
    weights = model.head_weights
    schema_mask = {value: key for key, value in _MASKS.items()}[model.mask]
    lambdas = model.lambdas
    schedule = ({"schedule_type": "constant", "lambda_const": float(lambdas[0])} if np.all(lambdas == lambdas[0])
                else {"schedule_type": "custom", "lambdas_custom": [float(x) for x in lambdas]})
    return {"sequence_length": int(model.sequence_length), "num_layers": model.num_layers,
            "mask_config": {"mask_type": schema_mask, "window_size": model.window},
            "attention_config": {"num_heads": model.num_heads, "alibi_slopes": compact(model.alibi_slopes),
                                 "head_weights": None if np.all(weights == weights.flat[0]) else compact(weights),
                                 "softmax_temperature": float(model.temperature)},
            "content_config": {"diagonal_scores": compact(model.diagonal_scores),
                               "base_scores": compact(model.base_scores)},
            "lambda_schedule_config": schedule}


def _allowed(n: int, mask: str, window: int | None) -> np.ndarray:
    """``allowed[i, j]`` of `jaxroll.engine.alibi.allowed`: j <= i, i - W < j <= i, or every j."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    if mask == "full":
        return np.ones((n, n), dtype=bool)
    return (j <= i) & (j > i - window) if mask == "sliding" else j <= i


def _distinct_heads(model: SmallModel) -> int:
    keys = np.stack([model.alibi_slopes, model.diagonal_scores, model.base_scores], axis=-1).reshape(-1, 3)
    return int(np.unique(keys, axis=0).shape[0])


def is_small(model: SmallModel, n: int | None = None) -> bool:
    """Whether NumPy is the faster path at length `n`: at most `SMALL_ENTRIES` kernel entries formed."""
    n = model.sequence_length if n is None else int(n)
    heads = model.num_layers if model.kind == "dense" else _distinct_heads(model)
    return (heads + model.num_layers) * n * n <= SMALL_ENTRIES


def _layer_kernels(model: SmallModel, n: int):
    """The ``(n, n)`` kernel of each layer t = 0..T-1, each distinct head and layer formed once."""
    if model.kind == "dense":
        for layer in model.kernels:
            yield layer[:n, :n]
        return
    keep = _allowed(n, model.mask, model.window)
    offsets = (np.arange(n)[:, None] - np.arange(n)[None, :]).astype(np.float64)
    diagonal = np.eye(n)
    heads: dict[tuple, np.ndarray] = {}
    layers: dict[bytes, np.ndarray] = {}
    tau = model.temperature
    for t in range(model.num_layers):
        parts = (model.alibi_slopes[t], model.diagonal_scores[t], model.base_scores[t], model.head_weights[t])
        key = b"".join(np.ascontiguousarray(part).tobytes() for part in parts)
        if key not in layers:
            weights = parts[3] / parts[3].sum()
            kernel = np.zeros((n, n))
            for m, d, b, w in zip(*parts[:3], weights):
                if w == 0:  # a padded or silenced head adds nothing
                    continue
                head = heads.get((m, d, b))
                if head is None:
                    scores = np.where(keep, (-m * offsets + d * diagonal + b) / tau, -np.inf)
                    scores = np.exp(scores - scores.max(axis=1, keepdims=True))
                    head = heads[(m, d, b)] = scores / scores.sum(axis=1, keepdims=True)
                kernel += w * head
            layers[key] = kernel
        yield layers[key]


def rollout_rows(model: SmallModel, starts: np.ndarray, n: int | None = None) -> np.ndarray:
    """``starts R_T ... R_1`` for start rows ``starts (K, n)``, float64, not normalised: ``(K, n)``.

    ``R_t = (1 - lambda_t) I + lambda_t A_t``; layer T acts first on the row
    (the row of ``P_T = R_T ... R_1``), so the kernels are applied from the last.
    """
    n = model.sequence_length if n is None else int(n)
    rows = np.array(starts, dtype=np.float64, ndmin=2)
    kernels = list(_layer_kernels(model, n))
    for lam, kernel in zip(model.lambdas[::-1], kernels[::-1]):
        rows = (1.0 - lam) * rows + lam * (rows @ kernel)
    return rows


def influence_with_mass(model: SmallModel, n: int | None = None) -> tuple[np.ndarray, float]:
    """``(p, mass)`` as `jaxroll.influence_with_mass`: ``mass = sum_j (e_{n-1}^T R_T ... R_1)_j`` and
    ``p (n,)`` that row over `mass`, in NumPy float64."""
    n = model.sequence_length if n is None else int(n)
    start = np.zeros(n)
    start[-1] = 1.0
    row = rollout_rows(model, start, n)[0]
    mass = float(row.sum())
    return row / mass, mass


def save_config(model: SmallModel, path) -> Path:
    """Write `model` (an ALiBi model) as `jaxroll.io.save_config` writes the same model loaded with JAX:
    `config_of`, through the same YAML writer (tests/test_latency.py compares the two files)."""
    from .io import write_yaml

    return write_yaml(config_of(model), path)


def working_bytes(model: SmallModel, n: int | None = None) -> int:
    """Peak bytes of a NumPy rollout at `n` (an estimate, for `jaxroll.memory.check_fits`): the distinct head
    and layer kernels kept, ``(n, n)`` float64 each, and three more for the scores being formed."""
    n = model.sequence_length if n is None else int(n)
    heads = 0 if model.kind == "dense" else _distinct_heads(model)
    return 8 * n * n * (heads + model.num_layers + 3)

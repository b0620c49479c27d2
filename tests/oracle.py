"""A plain NumPy float64 implementation of the rollout, written for the tests.

It follows docs/design.md ("The mathematics") literally: dense per-head score
matrices, a masked row softmax, the head-weighted average, ``R_t = (1 - lambda_t) I + lambda_t A_t``
and the full matrix product ``P_T = R_T ... R_1`` layer by layer. It shares no
code with jaxroll, and reads configurations with PyYAML itself.

`influence_by_correlation` is a second route for causal ALiBi models at
N = 2048, where the dense kernels cost minutes per file: each head's row
product as a direct correlation with running-sum normalisers
(tests/test_published_2048.py checks it against the dense route first).
"""

import numpy as np
import yaml


def read_config(path) -> dict:
    with open(path, encoding="utf-8") as handle:
        text = handle.read().replace("\t", " ")
    return yaml.safe_load(text)


def _broadcast(nested, num_layers, num_heads):
    array = np.asarray(nested, dtype=np.float64)
    return np.broadcast_to(array, (num_layers, num_heads))


def config_arrays(config: dict) -> dict:
    """The config as explicit (T,), (T, H) float64 arrays."""
    T = config["num_layers"]
    attention = config["attention_config"]
    H = attention["num_heads"]
    schedule = config["lambda_schedule_config"]
    kind = schedule["schedule_type"]
    if kind == "constant":
        lambdas = np.clip(np.full(T, schedule["lambda_const"], dtype=np.float64), 0, 1)
    elif kind == "power_decay":
        t = np.arange(T, dtype=np.float64)
        lambdas = np.clip(schedule["lambda_0"] / (t + 1) ** schedule["beta"], 0, 1)
    else:
        lambdas = np.asarray(schedule["lambdas_custom"], dtype=np.float64)
    weights = attention.get("head_weights")
    weights = np.ones((T, H)) if weights is None else _broadcast(weights, T, H)
    mask = config.get("mask_config", {}) or {}
    return {
        "lambdas": lambdas,
        "slopes": _broadcast(attention["alibi_slopes"], T, H),
        "diagonal": _broadcast(config["content_config"]["diagonal_scores"], T, H),
        "base": _broadcast(config["content_config"]["base_scores"], T, H),
        "weights": weights,
        "temperature": float(attention.get("softmax_temperature", 1.0)),
        "mask": mask.get("mask_type", "causal"),
        "window": mask.get("window_size"),
    }


def allowed(n, mask, window):
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    if mask == "full":
        return np.ones((n, n), dtype=bool)
    if mask == "causal":
        return j <= i
    return (j <= i) & (j > i - window)  # sliding / sliding_window


def head_kernels(slopes, diagonals, bases, temperature, n, mask="causal", window=None):
    """Row-softmax kernels of H heads at once, shape (H, n, n).

    In-place NumPy operations only to keep the test suite fast; the maths is
    the literal dense masked softmax of (-m (i - j) + d [i == j] + b) / tau.
    """
    slopes, diagonals, bases = (np.asarray(x, dtype=np.float64).reshape(-1, 1, 1)
                                for x in (slopes, diagonals, bases))
    offsets = (np.arange(n)[:, None] - np.arange(n)[None, :]).astype(np.float64)
    scores = -slopes * offsets
    diagonal = np.arange(n)
    scores[:, diagonal, diagonal] += diagonals[:, :, 0]
    scores += bases
    scores /= temperature
    scores[:, ~allowed(n, mask, window)] = -np.inf
    scores -= scores.max(axis=2, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=2, keepdims=True)
    return scores


def layer_kernel(arrays, t, n, heads_at_once=8):
    w = arrays["weights"][t] / arrays["weights"][t].sum()
    kernel = np.zeros((n, n))
    for start in range(0, len(w), heads_at_once):  # chunks of heads stay in cache
        part = slice(start, start + heads_at_once)
        kernels = head_kernels(arrays["slopes"][t, part], arrays["diagonal"][t, part],
                               arrays["base"][t, part], arrays["temperature"], n,
                               arrays["mask"], arrays["window"])
        kernel += np.einsum("h,hij->ij", w[part], kernels)
    return kernel


def rollout_matrix(arrays, n):
    product = np.eye(n)
    for t, lam in enumerate(arrays["lambdas"]):
        transition = (1 - lam) * np.eye(n) + lam * layer_kernel(arrays, t, n)
        product = transition @ product
    return product


def influence(arrays, n):
    """Last row of P_T by row-vector products (cheaper, same maths).

    A layer whose slopes, content, base scores and head weights equal the
    previous layer's (every layer of a published no-content file) reuses that
    layer's kernel: the same function of the same numbers, formed once (BLOOM's
    70 layers of 112 heads cost 2.7 s formed one by one).
    """
    row = np.zeros(n)
    row[-1] = 1.0
    key, kernel = None, None
    for t in reversed(range(len(arrays["lambdas"]))):
        lam = arrays["lambdas"][t]
        layer = tuple(np.asarray(arrays[name][t], dtype=np.float64).tobytes()
                      for name in ("slopes", "diagonal", "base", "weights"))
        if layer != key:
            key, kernel = layer, layer_kernel(arrays, t, n)
        row = (1 - lam) * row + lam * (row @ kernel)
    return row


def _row_times_head(row, slope, diagonal, base, temperature, n):
    """``row @ A_h`` for one causal ALiBi head at length n, without forming A_h.

    A different route from the dense kernels above (for N = 2048, where they
    cost minutes): the off-diagonal part of the score, ``-m (i - j) + b``, is a
    function of ``i - j`` only, so ``sum_i u_i A_h[i, j]`` is a correlation
    of ``u / Z`` with ``exp(-m k / tau)``, k >= 1 (np.convolve, direct, no
    FFT), plus the diagonal term. Each row's shift is its maximum score
    ``max(d, -m) + b`` (row 0 has only its diagonal), and
    ``Z_i = exp(d - c_i) + cumsum_k exp(-m k - c_i)``: a running sum, not a
    closed form. Everything exponentiated is <= 0 after the shift.
    """
    k = np.arange(n, dtype=np.float64)
    shift = np.full(n, max(diagonal + base, -slope + base) / temperature)
    shift[0] = (diagonal + base) / temperature                   # row 0 reads only itself
    diag = np.exp((diagonal + base) / temperature - shift)      # numerator at (i, i)
    # exp((-m k + b) / tau - shift_i) = geometric[k] * scale[i], k = i - j >= 1
    geometric = np.exp(-slope * k / temperature)
    scale = np.zeros(n)                                          # row 0 has no off-diagonal entry
    scale[1:] = np.exp(base / temperature - shift[1:])
    partial = np.concatenate([[0.0], np.cumsum(geometric[1:])])  # sum_{k=1}^{i} geometric[k]
    normaliser = diag + scale * partial
    weighted = row / normaliser
    tail = geometric.copy()
    tail[0] = 0.0
    # off[j] = sum_{k >= 1} weighted[j + k] scale[j + k] geometric[k]
    off = np.convolve((weighted * scale)[::-1], tail)[:n][::-1]
    return weighted * diag + off


def influence_by_correlation(arrays, n):
    """Last row of P_T for causal ALiBi + content models, head by head (see `_row_times_head`)."""
    assert arrays["mask"] == "causal"
    row = np.zeros(n)
    row[-1] = 1.0
    for t in reversed(range(len(arrays["lambdas"]))):
        lam = arrays["lambdas"][t]
        w = arrays["weights"][t] / arrays["weights"][t].sum()
        mixed = np.zeros(n)
        for h in range(len(w)):
            if w[h] == 0:
                continue
            mixed += w[h] * _row_times_head(row, arrays["slopes"][t, h], arrays["diagonal"][t, h],
                                            arrays["base"][t, h], arrays["temperature"], n)
        row = (1 - lam) * row + lam * mixed
    return row


def mixed_kernels(scores_of, weights, n):
    """Head-weighted causal softmax rows ``(T, n, n)`` from per-head scores ``scores_of(t, h) -> (n, n)``
    and head weights ``(T, H)`` (normalised here)."""
    weights = np.asarray(weights, dtype=np.float64)
    weights = weights / weights.sum(axis=1, keepdims=True)
    causal = np.tril(np.ones((n, n), bool))
    layers = []
    for t in range(weights.shape[0]):
        mixed = np.zeros((n, n))
        for h in range(weights.shape[1]):
            logits = np.where(causal, scores_of(t, h), -np.inf)
            e = np.exp(logits - logits.max(axis=1, keepdims=True))
            mixed += weights[t, h] * e / e.sum(axis=1, keepdims=True)
        layers.append(mixed)
    return np.stack(layers)


def last_row(kernels, lambdas):
    """Row n - 1 of ``P_T = R_T ... R_1``, ``R_t = (1 - lambda_t) I + lambda_t A_t``, the full product formed
    layer by layer from dense kernels ``(T, n, n)``; normalised."""
    n = kernels.shape[-1]
    product = np.eye(n)
    for t in range(len(lambdas)):
        product = ((1 - lambdas[t]) * np.eye(n) + lambdas[t] * kernels[t]) @ product
    return product[-1] / product[-1].sum()


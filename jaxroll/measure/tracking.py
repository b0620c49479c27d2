"""Position bias from inside a training loop: every k steps, on a fixed evaluation set, within a time budget.

`track` (a hand-written loop) and `track_callback` / `track_trainer` (a
Hugging Face ``Trainer``) measure the model being trained with
`jaxroll.measure.measure` on token ids ``(S, N)`` that the user fixes, at
every step that is a multiple of `every` (step 0 included), and append each
measurement to a series folder in the layout of `jaxroll.measure.series`:
``OUT/checkpoint-STEP/`` as ``jaxroll measure`` writes it, and the summary
``OUT/series/series.csv`` and ``series.npz`` (``jaxroll series OUT`` draws
``series.png``; the callback draws it at the end of training).

The budget: a due call whose measurement would take longer than
`budget_seconds` is skipped, with one warning line on stderr, rather than
stall training. The first due call times one sequence and estimates S times
that; every later one uses the time of the last measurement (its forward and
backward passes; writing the files and the rollout's summary add a little,
and the first summary compiles the rollout once). The first measurement says
on stderr what a call costs.

The measurement does not perturb training: the model's mode (``train``), its
parameters' ``requires_grad`` and ``.grad`` and the random states of Python,
NumPy and torch (CPU and every CUDA device) are as before the call, so the
training loss of a run with tracking is bit-identical to one without
(``tests/test_track.py`` checks it in a real ``Trainer`` run).

torch and transformers are imported when a call measures, never on import.
When JAX is first imported here (the summary's rollout), it is told not to
preallocate GPU memory (``XLA_PYTHON_CLIENT_PREALLOCATE=false``, unless set),
so it does not take the memory of the model being trained.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from ..errors import ConfigError

__all__ = ["track", "track_callback", "track_trainer", "SCALARS_LOGGED"]

SCALARS_LOGGED = ("lambda_mean", "w1", "noise", "w1_over_noise", "p_value", "middle_mass_measured",
                  "middle_mass_predicted", "u_index_measured", "u_index_predicted", "argmin_measured",
                  "argmin_predicted", "seconds")
"""The series columns a measurement returns (and the callback logs), each as ``jaxroll/NAME``."""

_STATE = "track.json"  # in OUT/series/: the cost of the last measurement, for the budget


def _check(token_ids, every, budget_seconds) -> np.ndarray:
    if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
        raise ConfigError(f"every: got {every!r}; allowed: an integer >= 1 (measure every k steps)")
    if budget_seconds is not None and not (isinstance(budget_seconds, (int, float)) and budget_seconds > 0):
        raise ConfigError(f"budget_seconds: got {budget_seconds!r}; allowed: a number > 0, or None (no budget)")
    if hasattr(token_ids, "detach"):  # a torch tensor
        token_ids = token_ids.detach().cpu().numpy()
    ids = np.asarray(token_ids)
    if ids.ndim != 2 or ids.shape[0] < 2 or ids.shape[1] < 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ConfigError(f"token_ids: got shape {ids.shape} of {ids.dtype}; allowed: integer token ids (S, N) with "
                          "S >= 2 sequences (the noise of the mean needs two) and N >= 2")
    return ids.astype(np.int64)


def _warn(message: str) -> None:
    print(f"jaxroll track: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _untouched(model):
    """The model's mode and gradients and every random state, as they were on entry, on exit."""
    import random

    import torch

    parameters = list(model.parameters())
    training, flags, grads = model.training, [p.requires_grad for p in parameters], [p.grad for p in parameters]
    python, numpy = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)
        for parameter, flag, grad in zip(parameters, flags, grads):
            parameter.requires_grad_(flag)
            parameter.grad = grad
        model.train(training)


def _measure(model, ids, stats, queries, step):
    from .passes import measure
    from .layer_maps import layer_map_for

    if stats is None:
        from .layer_maps import resolve
        from .registry import default_stats

        stats = default_stats(layer_map_for(model).position, ids.shape[1], len(resolve(model).blocks))
    started = time.perf_counter()
    result = measure(model, ids, stats=stats, source=f"step {step}")
    if queries is not None:
        from ..theory.rows import normalised_rows, query_positions
        from .rows import influence_rows

        rows, positions = influence_rows(model, ids, query_positions(ids.shape[1], queries))
        result.extra.update(influence_rows_per_sequence=rows, influence_rows=normalised_rows(rows),
                            query_positions=positions)
        result.metadata["queries"] = [int(q) for q in positions]
    return result, time.perf_counter() - started


def _extends(model, ids, stats, out: Path, step: int) -> tuple:
    """The statistics to measure, once the series in `out` is known to be measured alike (`check_extends`)."""
    from .layer_maps import layer_map_for
    from .registry import default_stats, parse_stats
    from .series_check import architecture_of, check_extends

    layer_map = layer_map_for(model)
    config = model.config
    layers = (getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
              or getattr(config, "n_layers", 0))
    stats = parse_stats(stats) if stats is not None else default_stats(layer_map.position, ids.shape[1], layers)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    check_extends(out, token_ids=ids, stats=stats, dtype=dtype, steps=[step],
                  architecture=architecture_of(layer_map.name, layers, getattr(config, layer_map.num_heads)))
    return stats


def _within_budget(model, ids, stats, out: Path, step: int, state: dict, budget_seconds) -> bool:
    """Whether the measurement of `step` fits the budget (module docstring); one warning line when it does not."""
    if budget_seconds is None:
        return True
    count, length = ids.shape
    estimate = state.get("seconds")
    if estimate is None:  # the first due call: time one sequence
        _, probe = _measure(model, ids[:1], stats, None, step)
        estimate = probe * count
        _write_state(out, {"seconds": estimate, "estimated_from": "one sequence"})
    if estimate > budget_seconds:
        _warn(f"step {step} skipped: a measurement takes about {estimate:.3g} s (S = {count} sequences of "
              f"N = {length} tokens), over the budget of {budget_seconds:g} s per call")
        return False
    return True


def _read_state(out: Path) -> dict:
    path = out / "series" / _STATE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _write_state(out: Path, state: dict) -> None:
    (out / "series").mkdir(parents=True, exist_ok=True)
    path = out / "series" / _STATE
    path.with_name(_STATE + ".tmp").write_text(json.dumps(state) + "\n", encoding="utf-8")
    os.replace(path.with_name(_STATE + ".tmp"), path)


def track(model, step: int, *, token_ids, out, every: int, budget_seconds: float | None = None, stats=None,
          queries=None) -> dict | None:
    """Measure `model` at `step` when `step` is a multiple of `every`; append it to the series in `out`.

    Call it once per optimiser step of a hand-written loop, after the
    optimiser's update::

        for step in range(1, steps + 1):
            loss = model(**batch).loss; loss.backward(); optimiser.step(); optimiser.zero_grad()
            jaxroll.track(model, step, token_ids=evaluation_ids, out="runs/series", every=100,
                          budget_seconds=10)

    Args:
        model: the Hugging Face ``*ForCausalLM`` being trained (any family
            `jaxroll.measure.measure` maps).
        step: the optimiser step just completed (0: the model at
            initialisation); an integer >= 0, after the last step the
            series in `out` holds (a step already measured returns None).
        token_ids: ``(S, N)`` integer token ids of the evaluation set, the
            same at every call (S >= 2).
        out: the series folder (created when the first measurement is written).
        every: k >= 1: a call at a step that is not a multiple of k returns
            at once, reading and writing nothing.
        budget_seconds: skip a due call whose measurement would take longer,
            with one warning line (module docstring); None: no budget.
        stats: the statistics (default: the architecture's ``jaxroll measure``
            default; a series needs ``lambda`` and ``influence``).
        queries: also measure rows of ``P_T`` at these query positions (a
            count K or positions, as ``--queries``): the series then reports
            the by-distance exponents.

    Returns:
        ``{"jaxroll/NAME": value}`` for NAME in `SCALARS_LOGGED` when it
        measured; None when the step was not due, already measured in `out`,
        or skipped for the budget.

    Raises:
        ConfigError: `every` < 1, a budget <= 0, token ids not ``(S, N)``
            integers, a step that is not an integer >= 0; a series in `out`
            measured otherwise (other token ids, N or S, statistics, dtype or
            architecture) or a step before its last one
            (`jaxroll.measure.series_check.check_extends`); one line, before
            anything is measured or written.
    """
    from .series_check import check_step

    ids = _check(token_ids, every, budget_seconds)
    step = check_step(step)
    if step % every:
        return None
    from .series import checkpoint_folder, is_finished, update_series

    out = Path(out)
    folder = checkpoint_folder(out, step)
    if is_finished(folder):
        return None
    stats = _extends(model, ids, stats, out, step)
    count, length = ids.shape
    if "jax" not in sys.modules:  # before the summary's rollout first imports JAX
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    with _untouched(model):
        state = _read_state(out)
        if not _within_budget(model, ids, stats, out, step, state, budget_seconds):
            return None
        result, seconds = _measure(model, ids, stats, queries, step)
    result.metadata["step"] = int(step)
    from .outputs import write_measurement

    folder.mkdir(parents=True, exist_ok=True)
    write_measurement(result, folder, overwrite=True)
    if "seconds" not in state or state.get("estimated_from"):
        _warn(f"a measurement costs about {seconds:.3g} s per call (S = {count} sequences of N = {length} "
              f"tokens, every {every} steps" + (f"; budget {budget_seconds:g} s)" if budget_seconds else ")"))
    _write_state(out, {"seconds": seconds, "estimated_from": None})
    update_series(out, [step])
    summary = _row(out, step)
    return {f"jaxroll/{name}": summary[name] for name in SCALARS_LOGGED}


def _row(out: Path, step: int) -> dict:
    from .series import read_series

    columns = read_series(out)["columns"]
    index = columns["step"].index(int(step))
    return {name: values[index] for name, values in columns.items()}


def _callback_class():
    """`transformers.TrainerCallback` subclass, made on first use (transformers imports only then)."""
    global _CALLBACK
    if _CALLBACK is not None:
        return _CALLBACK
    from transformers import TrainerCallback

    class TrackCallback(TrainerCallback):
        """`track` at every step end (and at step 0 when training begins), logged through the Trainer.

        The scalars go to ``trainer.log`` when the callback knows its trainer
        (`track_trainer`), so every logger the Trainer reports to receives
        them; otherwise they are added to ``state.log_history``. Measures on
        the main process only (``state.is_world_process_zero``).
        """

        def __init__(self, token_ids, out, *, every, budget_seconds=None, stats=None, queries=None, trainer=None):
            self.token_ids = _check(token_ids, every, budget_seconds)
            self.out, self.every, self.budget_seconds = Path(out), int(every), budget_seconds
            self.stats, self.queries, self.trainer = stats, queries, trainer
            self.calls = 0  # measurements made (for tests and logs)

        def _track(self, model, state, control):
            if not state.is_world_process_zero or state.global_step % self.every:
                return
            scalars = track(model, state.global_step, token_ids=self.token_ids, out=self.out, every=self.every,
                            budget_seconds=self.budget_seconds, stats=self.stats, queries=self.queries)
            if scalars is None:
                return
            self.calls += 1
            if self.trainer is not None:
                # The handler's on_log clears should_log: the Trainer's own loss log of this step stays due.
                due = control.should_log
                self.trainer.log(dict(scalars))
                control.should_log = due
            else:
                state.log_history.append({**scalars, "step": state.global_step})

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self._track(model, state, control)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self._track(model, state, control)

        def on_train_end(self, args, state, control, **kwargs):
            if state.is_world_process_zero and (self.out / "series" / "series.csv").is_file():
                from ..plot import plot_series
                from .series import read_series

                data = read_series(self.out)
                columns, arrays = data["columns"], data["arrays"]
                plot_series(self.out / "series" / "series.png", arrays["steps"], arrays["measured"],
                            arrays["lambdas"], columns["w1_over_noise"],
                            title=f"{self.out.name}: N = {arrays['measured'].shape[1]}, S = {columns['sequences'][0]}")

    _CALLBACK = TrackCallback
    return TrackCallback


_CALLBACK = None


def track_callback(token_ids, out, *, every: int, budget_seconds: float | None = None, stats=None, queries=None,
                   trainer=None):
    """A ``transformers.TrainerCallback`` that calls `track` at every step end (and at step 0).

    Pass it to ``Trainer(..., callbacks=[...])``; the arguments are those of
    `track`. With `trainer` (or through `track_trainer`) the scalars are
    logged with ``trainer.log``; without, they go to ``state.log_history``.

    Raises:
        ConfigError: as `track`, when the callback is made (before training).
    """
    return _callback_class()(token_ids, out, every=every, budget_seconds=budget_seconds, stats=stats,
                             queries=queries, trainer=trainer)


def track_trainer(trainer, token_ids, out, *, every: int, budget_seconds: float | None = None, stats=None,
                  queries=None):
    """Add a `track_callback` that logs through `trainer` (``trainer.log``) to `trainer`; return the callback."""
    callback = track_callback(token_ids, out, every=every, budget_seconds=budget_seconds, stats=stats,
                              queries=queries, trainer=trainer)
    trainer.add_callback(callback)
    return callback

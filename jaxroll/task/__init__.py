"""Task-level lost in the middle: cases, teacher-forced scores, and the bridge to predicted influence.

``jaxroll task MODEL_DIR`` builds seeded cases of three tasks with the
model's own tokenizer (`jaxroll.task.cases`: ``kv``, key-value retrieval
in the format of Liu et al. 2023; ``passkey``; ``copy``), the relevant record
at a requested token depth, scores them teacher-forced
(`jaxroll.task.scoring`: the gold answer's log-probability and greedy exact
match, no generation loop) over a depth x length grid
(`jaxroll.task.grid`: batched, resumable, data parallel like ``measure``),
and summarises accuracy by depth and the effective context length
(`jaxroll.task.summary`); ``jaxroll task --cases FILE`` scores cases given
as token ids instead (`jaxroll.task.given`: no tokenizer). ``jaxroll compare-task`` sets a task curve beside
the influence the rollout predicts at the same positions
(`jaxroll.task.versus_influence`), or an accuracy table from outside
beside the influence mass of each record's span, through a monotone link
fitted on some settings and tested on the others (`jaxroll.task.external`),
with each measured case's own rollout row over its own record
(`jaxroll.task.per_case`, ``compare-task --per-case``).

The scoring needs torch and transformers (``jaxroll[measure]``); the
summaries and the bridge read ``cases.jsonl`` with NumPy, SciPy and JAX
alone. Names load lazily.
"""

from .._lazy import lazy_names

_NAMES = {
    "TASKS": "cases", "Case": "cases", "Builder": "cases", "make_case": "cases", "vocabulary_pool": "cases",
    "score_cases": "scoring", "score_batch": "scoring",
    "grid_cases": "grid", "run_grid": "grid", "read_rows": "grid", "read_cases": "given",
    "Cell": "summary", "cells": "summary", "effective_length": "summary", "depth_average": "summary",
    "bootstrap_interval": "summary", "write_summary": "summary", "plot_task": "summary", "THRESHOLD": "summary",
    "TaskComparison": "versus_influence", "compare_task": "versus_influence", "plot_comparison": "versus_influence",
    "record_influence": "versus_influence",
    "AccuracyTable": "external", "TableComparison": "external", "Link": "external",
    "read_accuracy_table": "external", "span_masses": "external", "fit_link": "external",
    "compare_accuracy_table": "external", "write_table_comparison": "external", "noise_ceiling": "external",
    "true_accuracies": "external",
    "MeasuredCases": "per_case", "read_measured_cases": "per_case", "per_case_masses": "per_case",
    "compare_per_case": "per_case",
}

__all__ = sorted(_NAMES)


__getattr__, __dir__ = lazy_names(__name__, _NAMES, globals())

"""Teacher-forced scoring of cases: the gold answer's log-probability and exact match.

For a prompt ``x_0 .. x_{L-1}`` and gold answer ``y_0 .. y_{A-1}`` the model
reads ``x_0 .. x_{L-1} y_0 .. y_{A-2}`` once; the logits ``z_k`` at input
position ``L - 1 + k`` predict ``y_k``. Then

    logprob = sum_k log softmax(z_k)[y_k]            (nats)
    exact   = all_k argmax(z_k) == y_k               (greedy decoding reproduces y)
    correct = #{k : argmax(z_k) == y_k}              (answer tokens right)

Greedy decoding would feed its own tokens back; as long as they equal the
gold ones the inputs are the same, so `exact` is exactly "greedy decoding
writes the gold answer" with no generation loop. Cases are batched only
with cases of the same prompt and answer lengths: no padding, no attention
mask, the answer positions are the same columns in every row. Only the
last ``A`` positions go through the output layer (``logits_to_keep``), so
memory does not grow with ``L x vocabulary``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["score_cases", "score_batch"]


def score_batch(model, prompts: np.ndarray, answers: np.ndarray, prefix=()):
    """Scores of one batch: prompts ``(B, L)`` and answers ``(B, A)`` of int ids.

    `prefix`: ids put before every prompt (`SinkTokens`' k sink ids): the
    model reads ``prefix + prompt + answer[:-1]``, every position shifted by
    ``len(prefix)``; the scored positions are still the last ``A``.

    Returns:
        ``(logprob (B,) float64, exact (B,) bool, correct (B,) int)``.
    """
    import torch

    device = next(model.parameters()).device
    front = np.broadcast_to(np.asarray(prefix, dtype=np.int64), (prompts.shape[0], len(prefix)))
    inputs = np.concatenate([front, prompts, answers[:, :-1]], axis=1)
    width = answers.shape[1]
    with torch.no_grad():
        tensor = torch.as_tensor(inputs, dtype=torch.long, device=device)
        logits = model(input_ids=tensor, logits_to_keep=width, use_cache=False).logits[:, -width:, :]
        gold = torch.as_tensor(answers, dtype=torch.long, device=device)
        # float64 log-softmax: sums over a few tokens stay exact to ~1e-12 against an oracle
        logprobs = torch.log_softmax(logits.double(), dim=-1).gather(-1, gold[..., None])[..., 0]
        hits = logits.argmax(dim=-1) == gold
    return (logprobs.sum(-1).cpu().numpy(), hits.all(-1).cpu().numpy(), hits.sum(-1).cpu().numpy().astype(int))


def batches(cases, batch_size: int):
    """Index lists of at most `batch_size` cases sharing (prompt length, answer length), in first-seen order."""
    groups: dict = {}
    for index, case in enumerate(cases):
        groups.setdefault((len(case.prompt_ids), len(case.answer_ids)), []).append(index)
    for members in groups.values():
        for start in range(0, len(members), batch_size):
            yield members[start: start + batch_size]


def score_cases(model, cases, batch_size: int = 8, on_batch=None, prefix=()) -> list[dict]:
    """One row per case (in the order of `cases`): its fields and ``logprob, exact, correct``.

    `prefix` goes before every prompt (`score_batch`); the rows keep the
    prompt's own ids and depths.

    `on_batch(rows)` is called after every batch with that batch's rows (to
    append them to a file, so that an interrupted run keeps them).
    """
    rows: list = [None] * len(cases)
    for members in batches(cases, batch_size):
        prompts = np.asarray([cases[i].prompt_ids for i in members], dtype=np.int64)
        answers = np.asarray([cases[i].answer_ids for i in members], dtype=np.int64)
        logprob, exact, correct = score_batch(model, prompts, answers, prefix)
        done = []
        for position, index in enumerate(members):
            rows[index] = case_row(cases[index], float(logprob[position]), bool(exact[position]),
                                   int(correct[position]))
            done.append(rows[index])
        if on_batch is not None:
            on_batch(done)
    return rows


def case_row(case, logprob: float, exact: bool, correct: int) -> dict:
    """The ``cases.jsonl`` line of a scored case (stable names first)."""
    return {"task": case.task, "length": case.length, "depth": case.depth, "prompt_ids": list(case.prompt_ids),
            "answer_ids": list(case.answer_ids), "logprob": logprob, "exact": exact, "correct": correct,
            "depth_fraction": case.depth_fraction, "sample": case.sample, "seed": case.seed,
            "record_length": case.record_length, "key": case.key}

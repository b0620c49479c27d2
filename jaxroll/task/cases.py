"""Task cases built from a model's own tokenizer, token by token.

A case is a prompt of exactly ``length`` tokens and a gold answer. The
prompt is ``prefix + header + body + query``: the tokenizer's own start
tokens (BOS where it adds one), the task's instruction, a body of filler with
the *relevant record* starting at token index ``depth``, and the question.
Everything is concatenated as token ids, never as text, so ``depth`` is
exact: ``prompt_ids[depth : depth + record_length]`` is the record. The
filler before the record is the tail of a stream of whole filler units and
the filler after it the head of another, so the record's neighbours are
whole units and only the body's two ends may cut one.

Tasks:

- ``kv``: key-value retrieval in the JSON format of Liu et al. (2023, "Lost
  in the Middle", arXiv 2307.03172): ``{"k1": "v1", "k2": "v2", ...}``, then
  ``Key: "k"`` and the value. Their keys and values are UUIDs; here each is
  `KEY_TOKENS` (`VALUE_TOKENS`) tokens drawn from the model's own
  vocabulary (`vocabulary_pool`), so a key costs a few tokens, not ~25.
- ``passkey``: a five-digit number hidden in repeated filler sentences
  (Mohtashami & Jaggi 2023, arXiv 2305.16300), asked for at the end.
- ``copy``: a span of `COPY_TOKENS` vocabulary tokens in the filler; the
  query repeats its first `COPY_CUE` tokens and the answer is the rest of
  the span (an induction copy, which needs no key lookup).

Each case is drawn from ``numpy.random.default_rng([seed, task, length,
depth index, sample])``: reproducible one by one, whatever the grid.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import ConfigError

__all__ = ["TASKS", "Case", "Builder", "make_case", "vocabulary_pool", "token_depth"]

TASKS = ("kv", "passkey", "copy")
"""The task names, in the order their seeds use."""
KEY_TOKENS = 2
VALUE_TOKENS = 2
PASSKEY_DIGITS = 5
COPY_TOKENS = 8
COPY_CUE = 2

_KV_HEADER = "Extract the value corresponding to the specified key in the JSON object below.\n\nJSON data:\n{"
_PASSKEY_HEADER = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
                   "I will quiz you about the important information there.")
_COPY_HEADER = "Below is some text with a passage of random words in it. Repeat the passage when asked."
_FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


@dataclasses.dataclass(frozen=True)
class Case:
    """One prompt and its gold answer.

    Attributes:
        task: ``kv``, ``passkey`` or ``copy``.
        length: ``len(prompt_ids)``.
        depth: the token index where the relevant record starts.
        depth_fraction: the requested depth in [0, 1] of the allowed range.
        sample: the case's index within its (task, length, depth) cell.
        seed: the grid's seed.
        record_length: the relevant record's length in tokens.
        prompt_ids, answer_ids: token ids.
    """

    task: str
    length: int
    depth: int
    depth_fraction: float
    sample: int
    seed: int
    record_length: int
    prompt_ids: tuple
    answer_ids: tuple

    @property
    def key(self) -> str:
        """The case's identity in a grid: task, length, requested depth and sample."""
        return case_key(self.task, self.length, self.depth_fraction, self.sample)


def case_key(task: str, length: int, depth_fraction: float, sample: int) -> str:
    return f"{task}/{length}/{float(depth_fraction):.6g}/{sample}"


def vocabulary_pool(tokenizer) -> np.ndarray:
    """Ids of the vocabulary's short alphanumeric word pieces: keys, values and copy spans.

    A token qualifies when it is not special and decodes on its own to 2-8
    letters or digits with no surrounding space, so that a key written from
    it reads as one short word.

    Raises:
        ConfigError: fewer than 2 such tokens.
    """
    special = set(tokenizer.all_special_ids)
    size = len(tokenizer)
    ids = [i for i in range(size) if i not in special]
    texts = tokenizer.batch_decode([[i] for i in ids])
    pool = [i for i, text in zip(ids, texts) if 2 <= len(text) <= 8 and text.isalnum() and text.isascii()]
    if len(pool) < 2:
        raise ConfigError(f"tokenizer: {len(pool)} alphanumeric word pieces of 2-8 characters; allowed: at least 2 "
                          "(keys and values are drawn from them)")
    return np.asarray(pool, dtype=np.int64)


def token_depth(fraction: float, first: int, last: int) -> int:
    """The token index ``first + round(fraction (last - first))`` of a depth fraction in [0, 1]."""
    return first + int(round(float(fraction) * (last - first)))


class Builder:
    """Encodes a tokenizer's pieces once and builds cases from them.

    `encode` is ``tokenizer(text, add_special_tokens=False)``; `prefix` is
    what the tokenizer adds before a text by default (e.g. Llama's BOS).
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.pool = vocabulary_pool(tokenizer)
        plain = self.encode("a")
        full = list(tokenizer("a")["input_ids"])
        self.prefix = tuple(full[: len(full) - len(plain)]) if full[len(full) - len(plain):] == plain else ()
        self.unknown = tokenizer.unk_token_id
        self.filler = self.encode(_FILLER)
        self.pieces = {
            "kv": (self.encode(_KV_HEADER), self.encode(' "'), self.encode('": "'), self.encode('",'),
                   self.encode('}\n\nKey: "'), self.encode('"\nCorresponding value: "')),
            "passkey": (self.encode(_PASSKEY_HEADER), self.encode(" The pass key is"),
                        self.encode(". Remember it."), self.encode(" is the pass key."),
                        self.encode(" What is the pass key? The pass key is")),
            "copy": (self.encode(_COPY_HEADER), self.encode("\nRepeat the passage of random words:")),
        }

    def encode(self, text: str) -> list:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def minimum_length(self, task: str) -> int:
        """The shortest prompt of `task`: prefix, header, record and query with no filler."""
        record, query, header = self._shape(task)
        return len(self.prefix) + header + record + query

    def _shape(self, task):
        """(record length, query length, header length) in tokens."""
        pieces = self.pieces[task]
        if task == "kv":
            header, quote, separator, end, query_open, query_close = pieces
            record = len(quote) + KEY_TOKENS + len(separator) + VALUE_TOKENS + len(end)
            return record, len(query_open) + KEY_TOKENS + len(query_close), len(header)
        if task == "passkey":
            header, opening, remember, closing, query = pieces
            number = len(self._number_ids("1" * PASSKEY_DIGITS))
            return len(opening) + 2 * number + len(remember) + len(closing), len(query), len(header)
        header, query = pieces
        return COPY_TOKENS, len(query) + COPY_CUE, len(header)

    def _number_ids(self, digits: str) -> list:
        ids = self.encode(" " + digits)
        if self.unknown is not None and self.unknown in ids:
            raise ConfigError("--tasks passkey: the tokenizer writes digits as its unknown token; allowed: kv, copy")
        return ids

    def depth_range(self, task: str, length: int) -> tuple[int, int]:
        """The first and last token index where `task`'s record can start in a prompt of `length`."""
        record, query, header = self._shape(task)
        first = len(self.prefix) + header
        last = length - query - record
        if last < first:
            raise ConfigError(f"--lengths {length}: too short for {task}; allowed: >= {self.minimum_length(task)} "
                              "tokens with this tokenizer")
        return first, last

    def _record_and_answer(self, task, rng):
        """(record ids, query ids, answer ids, filler unit generator) of one case."""
        pieces = self.pieces[task]
        if task == "kv":
            _, quote, separator, end, query_open, query_close = pieces
            key = list(rng.choice(self.pool, KEY_TOKENS))
            value = list(rng.choice(self.pool, VALUE_TOKENS))
            record = quote + key + separator + value + end

            def distractor():
                other = key
                while other == key:  # a distractor never repeats the gold key
                    other = list(rng.choice(self.pool, KEY_TOKENS))
                return quote + other + separator + list(rng.choice(self.pool, VALUE_TOKENS)) + end

            return record, query_open + key + query_close, value, distractor
        if task == "passkey":
            _, opening, remember, closing, query = pieces
            digits = str(rng.integers(1, 10)) + "".join(str(d) for d in rng.integers(0, 10, PASSKEY_DIGITS - 1))
            number = self._number_ids(digits)
            return opening + number + remember + number + closing, query, number, lambda: self.filler
        _, query = pieces
        span = list(rng.choice(self.pool, COPY_TOKENS))
        return span, query + span[:COPY_CUE], span[COPY_CUE:], lambda: self.filler

    def make(self, task: str, length: int, depth_fraction: float, sample: int, seed: int) -> Case:
        """The case of (`task`, `length`, `depth_fraction`, `sample`) under `seed` (see the module docstring)."""
        if task not in TASKS:
            raise ConfigError(f"--tasks: got {task!r}; allowed: a comma-separated subset of {','.join(TASKS)}")
        if not 0.0 <= float(depth_fraction) <= 1.0:
            raise ConfigError(f"--depths: got {depth_fraction}; allowed: fractions in [0, 1]")
        first, _ = self.depth_range(task, length)
        rng = np.random.default_rng([seed, TASKS.index(task), length, int(round(depth_fraction * 1e6)), sample])
        record, query, answer, unit = self._record_and_answer(task, rng)
        # The case's own record: a number may take more tokens than the nominal one (BPE merges digits).
        last = length - len(query) - len(record)
        if last < first:
            raise ConfigError(f"--lengths {length}: too short for this {task} case; allowed: >= "
                              f"{first + len(record) + len(query)} tokens with this tokenizer")
        depth = token_depth(depth_fraction, first, last)
        header = self.pieces[task][0]
        before = _stream(unit, depth - first)
        after = _stream(unit, length - len(query) - depth - len(record), head=True)
        prompt = list(self.prefix) + header + before + record + after + query
        assert len(prompt) == length and prompt[depth: depth + len(record)] == record
        return Case(task=task, length=length, depth=depth, depth_fraction=float(depth_fraction), sample=sample,
                    seed=seed, record_length=len(record), prompt_ids=tuple(int(i) for i in prompt),
                    answer_ids=tuple(int(i) for i in answer))


def _stream(unit, count: int, head: bool = False) -> list:
    """`count` tokens of whole filler units: the tail of the stream (`head`: its head)."""
    if count <= 0:
        return []
    units, total = [], 0
    while total < count:
        piece = list(unit())
        units.append(piece)
        total += len(piece)
    tokens = [token for piece in units for token in piece]
    return tokens[:count] if head else tokens[len(tokens) - count:]


def make_case(tokenizer, task: str, length: int, depth_fraction: float, sample: int = 0, seed: int = 0) -> Case:
    """One `Case` built with `tokenizer` (see `Builder.make`)."""
    return Builder(tokenizer).make(task, length, depth_fraction, sample, seed)

"""Text sources and the paper's sequence protocol.

Protocol (arXiv 2602.16837's measurement runs): walk the documents in order,
tokenise each with the tokenizer's defaults, keep those with at least N
tokens, take their first N tokens, no padding, stop after S kept documents;
record each kept document's index. A document given as token ids
(``.jsonl`` lines with ``input_ids`` or ``prompt_ids``, e.g. the
``cases.jsonl`` of ``jaxroll task``) is taken as it is: no tokenizer, so a
model trained on a synthetic vocabulary can be measured. Everything is
local: no network.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..io import read_text

__all__ = ["read_texts", "select_sequences", "load_tokenizer", "is_token_ids"]


def read_texts(path) -> list:
    """Documents from a local source, in order: strings, or lists of token ids.

    - ``.txt``: one document per block of lines separated by blank lines;
    - ``.jsonl``: one JSON object per line with a ``text`` field, or with
      token ids in ``input_ids`` or ``prompt_ids`` (a list of integers
      >= 0; every line of a file the same kind);
    - a directory written by ``datasets.Dataset.save_to_disk`` (needs the
      ``datasets`` package), its ``text`` column.

    Raises:
        ConfigError: a missing or empty source, a line without ``text``.
    """
    path = Path(path)
    if path.is_dir():
        return _read_dataset(path)
    if not path.is_file():
        raise ConfigError(f"--texts {path}: no such file or directory")
    if path.suffix == ".jsonl":
        documents = _read_jsonl(path)
    elif path.suffix == ".txt":
        blocks, current = [], []
        for line in read_text(path, "text").splitlines():
            if line.strip():
                current.append(line)
            elif current:
                blocks.append("\n".join(current))
                current = []
        if current:
            blocks.append("\n".join(current))
        documents = blocks
    else:
        raise ConfigError(f"--texts {path}: suffix {path.suffix!r}; allowed: .txt, .jsonl or a saved dataset directory")
    if not documents:
        raise ConfigError(f"--texts {path}: no documents (the file is empty)")
    return documents


def _read_jsonl(path: Path) -> list:
    """The ``text`` of each line, or its token ids (``input_ids``, else ``prompt_ids``), one kind per file."""
    documents, kinds = [], set()
    for number, line in enumerate(read_text(path, "JSON lines").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigError(f"--texts {path}: line {number} is not JSON ({error.msg})") from None
        if isinstance(record, dict) and isinstance(record.get("text"), str):
            documents.append(record["text"])
            kinds.add("text")
        elif isinstance(record, dict) and ("input_ids" in record or "prompt_ids" in record):
            ids = record.get("input_ids", record.get("prompt_ids"))
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                    for i in ids):
                raise ConfigError(f"--texts {path}: line {number}: token ids {ids!r:.40}; allowed: a list of "
                                  "integers >= 0")
            documents.append(ids)
            kinds.add("ids")
        else:
            raise ConfigError(f"--texts {path}: line {number} has no string field 'text' and no token ids "
                              "('input_ids' or 'prompt_ids')")
        if len(kinds) > 1:
            raise ConfigError(f"--texts {path}: line {number} mixes texts and token ids; allowed: one kind per file")
    return documents


def is_token_ids(documents) -> bool:
    """Whether `read_texts` gave token ids (no tokenizer needed) rather than texts."""
    return bool(documents) and not isinstance(documents[0], str)


def _read_dataset(path: Path) -> list[str]:
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"--texts {path}: a saved dataset needs the 'datasets' package; allowed: .txt, .jsonl") from None
    try:
        dataset = datasets.load_from_disk(str(path))
    except Exception as error:  # datasets raises several types for a bad directory
        raise ConfigError(f"--texts {path}: not a saved dataset ({type(error).__name__})") from None
    if isinstance(dataset, datasets.DatasetDict):
        if "train" not in dataset:
            raise ConfigError(f"--texts {path}: a DatasetDict without a 'train' split")
        dataset = dataset["train"]
    if "text" not in dataset.column_names:
        raise ConfigError(f"--texts {path}: no 'text' column; columns: {', '.join(dataset.column_names)}")
    documents = list(dataset["text"])
    if not documents:
        raise ConfigError(f"--texts {path}: no documents")
    return documents


def select_sequences(documents, tokenizer, length: int, samples: int | None = None):
    """Token ids ``(S, N)`` and document indices ``(S,)`` by the paper's protocol.

    A document that is a list of token ids is taken as it is (`tokenizer`
    may then be None).

    Raises:
        ConfigError: fewer than `samples` documents reach `length` tokens.
    """
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise ConfigError(f"length: got {length!r}; allowed: an integer >= 1")
    if samples is not None and (not isinstance(samples, int) or isinstance(samples, bool) or samples < 1):
        raise ConfigError(f"samples: got {samples!r}; allowed: an integer >= 1")
    rows, indices = [], []
    for index, text in enumerate(documents):
        ids = tokenizer(text)["input_ids"] if isinstance(text, str) else text
        if len(ids) >= length:
            rows.append(ids[:length])
            indices.append(index)
            if samples is not None and len(rows) == samples:
                break
    wanted = samples if samples is not None else 1
    if len(rows) < wanted:
        raise ConfigError(
            f"samples: {len(rows)} of {len(documents)} documents have at least {length} tokens; "
            f"allowed: at most that many samples, or a shorter --length"
        )
    return np.asarray(rows, dtype=np.int64), np.asarray(indices, dtype=np.int64)


TOKENIZER_FILES = "tokenizer.json, or tokenizer_config.json with vocab.json and merges.txt, vocab.txt or a " \
                  "sentencepiece model (tokenizer.model, spiece.model)"
"""What a folder needs for `load_tokenizer`, in the words of its refusal."""

_VOCABULARIES = ("vocab.json", "vocab.txt", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model")


def _tokenizer_files(directory: Path) -> tuple[list[str], bool]:
    """The tokenizer files in `directory`, and whether a tokenizer could be built from them."""
    names = {path.name for path in directory.iterdir()} if directory.is_dir() else set()
    found = sorted(names & {"tokenizer.json", "tokenizer_config.json", "merges.txt", *_VOCABULARIES})
    usable = "tokenizer.json" in names or any(name in names for name in _VOCABULARIES) or any(
        name.endswith(".model") for name in names)
    return found, usable


def load_tokenizer(directory):
    """The tokenizer saved in `directory`, from local files only.

    A folder without the files a tokenizer is built from (`TOKENIZER_FILES`)
    is refused in one line naming it and them, before transformers is asked;
    one whose files do not load, in one line naming the folder, the files
    found and transformers' reason.
    """
    from transformers import AutoTokenizer

    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(f"tokenizer {directory}: no such directory; allowed: a folder written by save_pretrained")
    found, usable = _tokenizer_files(directory)
    if not usable:
        what = f"only {', '.join(found)}" if found else "none of its files"
        raise ConfigError(f"tokenizer {directory}: no tokenizer in the folder ({what}); allowed: a folder with "
                          f"{TOKENIZER_FILES} (tokenizer.save_pretrained(folder) writes them)")
    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as error:  # noqa: BLE001 - transformers and tokenizers raise many kinds, some untyped
        lines = str(error).strip().splitlines()
        first = (lines[0][:160] if lines else "") or type(error).__name__
        raise ConfigError(f"tokenizer {directory}: cannot load it from {', '.join(found)} ({first}); allowed: "
                          f"{TOKENIZER_FILES}") from None

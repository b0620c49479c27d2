"""Helpers for the tiny test models, built offline: a word-level tokenizer over 60 made-up words, texts of
those words, and the command line run in-process."""

WORDS = [f"w{i}" for i in range(60)]


def word_level_tokenizer():
    """``[UNK]`` = 0 and ``w0..w59`` = 1..60, split on whitespace (a `PreTrainedTokenizerFast`)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{word: index + 1 for index, word in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")


def word_texts(path, lengths, seed: int = 0):
    """A .txt file of blank-line-separated documents of ``lengths`` random words (``default_rng(seed)``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    path.write_text("\n\n".join(" ".join(rng.choice(WORDS, size=n)) for n in lengths) + "\n", encoding="utf-8")
    return path


def run_cli(argv, capsys):
    """``jaxroll ARGV`` in this process: ``(exit status, stdout, stderr)``."""
    from jaxroll.cli import main

    code = main([str(item) for item in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def save_tiny(directory, config, tokenizer=None):
    """A randomly initialised causal LM of `config` (``torch.manual_seed(0)``) and `tokenizer` (default the
    word-level one) saved into `directory`, which is returned."""
    import torch
    import transformers

    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    (word_level_tokenizer() if tokenizer is None else tokenizer).save_pretrained(directory)
    return directory

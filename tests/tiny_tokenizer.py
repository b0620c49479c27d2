"""A word-level tokenizer over 60 made-up words, built offline for the tiny test models."""

WORDS = [f"w{i}" for i in range(60)]


def word_level_tokenizer():
    """``[UNK]`` = 0 and ``w0..w59`` = 1..60, split on whitespace (a `PreTrainedTokenizerFast`)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{word: index + 1 for index, word in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")

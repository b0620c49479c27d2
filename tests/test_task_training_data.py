"""The data builder of validation/train_task.py: records land at the depths asked, exactly.

Every check is against a construction written here: the depth rule
``first + round(f (last - first))`` with ``first = 1`` and ``last = length -
query - record`` counted from the format (``[OPEN, key, ARROW, value,
CLOSE]``, ``[QUERY, key, ARROW]``), the record found by a plain search for
its content, the gold answer read off the record. The same rule is checked on
`jaxroll task`'s own kv builder, so the two place records alike.
"""

import sys
from pathlib import Path

import numpy as np
import pytest
import validation_scripts  # tests/validation_scripts.py

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


tt = validation_scripts.load("train_task")
OPEN, ARROW, CLOSE, QUERY, BOS = 2, 3, 4, 5, 1  # the format as the module docstring writes it


def expected_depth(length, fraction, key_tokens, value_tokens):
    record, query = 1 + key_tokens + 1 + value_tokens + 1, 1 + key_tokens + 1
    first, last = 1, length - query - record
    return first + round(fraction * (last - first)), record


def records_with_key(prompt, key):
    """Start indices of ``[OPEN, *key, ARROW]`` in `prompt` (a plain scan)."""
    pattern = [OPEN, *key, ARROW]
    return [i for i in range(len(prompt) - len(pattern) + 1) if prompt[i: i + len(pattern)] == pattern]


@pytest.mark.parametrize("key_tokens,value_tokens", [(1, 1), (2, 1), (2, 3)])
@pytest.mark.parametrize("length", [37, 64, 128])
def test_record_lands_at_the_requested_token_depth(length, key_tokens, value_tokens):
    layout = tt.Layout(vocab=40, key_tokens=key_tokens, value_tokens=value_tokens)
    for fraction in (*tt.DEPTHS, 0.25, 0.55, 0.95):
        for sample in range(3):
            case = tt.make_case(layout, length, fraction, sample, seed=5)
            prompt = case["prompt_ids"]
            depth, record = expected_depth(length, fraction, key_tokens, value_tokens)
            assert len(prompt) == length and prompt[0] == BOS
            assert case["depth"] == depth and case["record_length"] == record
            key = prompt[length - key_tokens - 1: length - 1]  # the query's key
            assert prompt[length - key_tokens - 2] == QUERY and prompt[-1] == ARROW
            # The one record with the query's key starts at the depth asked; its value is the gold answer.
            assert records_with_key(prompt, key) == [depth]
            value = prompt[depth + 2 + key_tokens: depth + 2 + key_tokens + value_tokens]
            assert case["answer_ids"] == value
            assert prompt[depth + record - 1] == CLOSE
            assert all(s >= tt.FIRST_SYMBOL for s in key + value)


def test_every_token_index_of_the_range_is_reachable_exactly():
    layout = tt.Layout(vocab=24, key_tokens=2, value_tokens=1)
    length = 41
    last = length - 4 - 6
    rng = np.random.default_rng(0)
    for depth in range(1, last + 1):
        case = tt.case_at(layout, length, depth, rng)
        assert records_with_key(case["prompt_ids"], case["key"]) == [depth]
    for bad in (0, last + 1):
        with pytest.raises(ValueError, match="depth"):
            tt.case_at(layout, length, bad, rng)


def test_training_batches_follow_their_depth_law_and_every_target_is_its_records_value():
    layout = tt.Layout(vocab=64, key_tokens=1)
    rng = np.random.default_rng(3)
    inputs, targets = tt.training_batch(layout, 64, 400, rng, "ends", queries=3)
    depths = []
    for prompt, target in zip(inputs.tolist(), targets.tolist()):
        (depth,) = records_with_key(prompt[:64], prompt[62:63])  # the first query's key
        depths.append((depth - 1) / (64 - 3 - 5 - 1))
        due = [i for i, t in enumerate(target) if t != -100]
        assert due[0] == 63 and len(due) >= 2
        for i in due:  # each answer: the value of the one body record with the question's key
            assert prompt[i] == ARROW and prompt[i - 2] == QUERY
            (start,) = records_with_key(prompt[:64], prompt[i - 1: i])
            assert target[i] == prompt[start + 3]
    # Beta(1/2, 1/2): P(f < 0.2) = 2/pi asin(sqrt(0.2)) = 0.2952 on each side.
    outer = np.mean([d < 0.2 or d > 0.8 for d in depths])
    assert abs(outer - 2 * 0.2952) < 0.08
    assert tt.make_case(layout, 64, 0.3, 2, 9) == tt.make_case(layout, 64, 0.3, 2, 9)
    assert tt.make_case(layout, 64, 0.3, 2, 9) != tt.make_case(layout, 64, 0.3, 2, 10)


def test_jaxroll_task_builder_follows_the_same_depth_rule():
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_tokenizer import WORDS
    from tokenizers import Tokenizer, models, pre_tokenizers

    from jaxroll.task import cases

    vocabulary = ["[UNK]", *WORDS, *"0123456789", '"', ":", ",", "{", "}", ".", "?"]
    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(vocabulary)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    builder = cases.Builder(transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]"))
    for length in (64, 97):
        first, last = builder.depth_range("kv", length)
        for fraction in tt.DEPTHS:
            case = builder.make("kv", length, fraction, 0, 0)
            assert case.depth == first + round(fraction * (last - first))


def test_training_draws_only_the_train_lengths_and_a_too_short_one_is_refused_before_out(tmp_path, monkeypatch):
    layout = tt.Layout(vocab=16, key_tokens=1)
    drawn, real = [], tt.training_batch

    def spy(layout_, length, *rest):
        drawn.append(length)
        return real(layout_, length, *rest)

    monkeypatch.setattr(tt, "training_batch", spy)
    model = tt.build_model("bloom", layout, layers=1, heads=2, hidden=8, length=40, seed=0)
    monitor = tt.grid(layout, (24, 40), tt.DEPTHS, 1, seed=2)
    tt.train(model, layout, lengths=(16, 24), steps=12, batch_size=2, learning_rate=1e-3, warmup=2,
             depth_law="ends", queries=1, seed=0, monitor=monitor, eval_every=100, max_seconds=60, log=lambda _: None)
    assert len(drawn) == 12 and set(drawn) <= {16, 24} and len(set(drawn)) == 2
    # The shortest prompt holds BOS, one record (5) and the query (3): 9 tokens; 8 is refused, exit 2, no --out.
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as error:
        tt.main(["--out", str(out), "--lengths", "64", "--key-tokens", "1", "--train-lengths", "32", "8"])
    assert error.value.code == 2 and not out.exists()


ALIBI = Path(__file__).resolve().parents[1] / "validation" / "models" / "task-u-alibi"


@pytest.mark.parametrize("length", [96, 160, 192, 256])
def test_the_committed_held_out_cases_at_other_lengths_put_each_record_at_its_depth(length):
    """held_out_nN.jsonl (README.md, "A second length"): 200 cases a depth, seed 1, one-token keys and values.

    The record's span is the depth rule's, its key the query's and found once, its value the answer; the
    first case of each depth is rebuilt by the builder (the rest share its code path and seeding).
    """
    import json

    rows = [json.loads(line) for line in (ALIBI / f"held_out_n{length}.jsonl").read_text().splitlines()]
    assert len(rows) == 200 * 11
    assert [(r["depth_fraction"], r["sample"]) for r in rows] == [(f, s) for f in tt.DEPTHS for s in range(200)]
    layout = tt.Layout(vocab=64, key_tokens=1, value_tokens=1)
    for row in rows:
        prompt = row["prompt_ids"]
        depth, record = expected_depth(length, row["depth_fraction"], 1, 1)
        assert (row["length"], row["seed"], len(prompt), prompt[0]) == (length, 1, length, BOS)
        assert (row["record_start"], row["record_end"]) == (depth, depth + record)
        assert prompt[-3] == QUERY and prompt[-1] == ARROW
        assert records_with_key(prompt, prompt[-2:-1]) == [depth]
        assert row["answer_ids"] == [prompt[depth + 3]] and prompt[depth + 4] == CLOSE
        assert min(prompt[-2], prompt[depth + 3]) >= tt.FIRST_SYMBOL
        assert row["exact_step9000"] in (0, 1) and row["exact_a5"] in (0, 1)
        if row["sample"] == 0:
            case = tt.make_case(layout, length, row["depth_fraction"], 0, seed=1)
            assert (case["prompt_ids"], case["answer_ids"]) == (prompt, row["answer_ids"])

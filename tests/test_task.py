"""`jaxroll.task`: cases, teacher-forced scores, summaries and the bridge, each against an independent oracle.

Models are tiny and random-init (from config classes) or hand-made; the
tokenizer is word level, built offline (the 60 words of `tiny_tokenizer`,
digits split one by one, punctuation): no network.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers  # noqa: E402
from tiny_tokenizer import WORDS  # noqa: E402

from jaxroll.task import cases, grid, scoring, summary, versus_influence  # noqa: E402

PUNCTUATION = ['"', ":", ",", "{", "}", ".", "?"]


def task_tokenizer():
    """[UNK] = 0, w0..w59, digits, punctuation; digits and punctuation split one per token."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocabulary = ["[UNK]", *WORDS, *"0123456789", *PUNCTUATION]
    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(vocabulary)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation(),
                                                     pre_tokenizers.Digits(individual_digits=True)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")


VOCAB = 80  # > the 78 ids of task_tokenizer


@pytest.fixture(scope="module")
def builder():
    return cases.Builder(task_tokenizer())


def tiny_model(family="llama", dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    if family == "llama":
        config = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          hidden_size=32, intermediate_size=64, vocab_size=VOCAB)
    else:
        config = transformers.BloomConfig(n_layer=2, n_head=4, hidden_size=32, vocab_size=VOCAB)
    return transformers.AutoModelForCausalLM.from_config(config).to(dtype).eval()


def find(sequence, pattern):
    """First index of `pattern` in `sequence` (a plain search, independent of the builder's bookkeeping)."""
    for start in range(len(sequence) - len(pattern) + 1):
        if list(sequence[start: start + len(pattern)]) == list(pattern):
            return start
    return None


@pytest.mark.parametrize("task", cases.TASKS)
def test_record_starts_at_the_requested_token_depth(builder, task):
    for length in (72, 97):
        first, last = builder.depth_range(task, length)
        for fraction in (0.0, 0.3, 0.5, 1.0):
            case = builder.make(task, length, fraction, 1, 7)
            assert len(case.prompt_ids) == length
            assert case.depth == first + round(fraction * (last - first))
            # Locate the record by its content: the answer's first occurrence in the prompt.
            answer = list(case.answer_ids)
            offset = {"kv": 1 + cases.KEY_TOKENS + 3, "copy": cases.COPY_CUE,
                      "passkey": len(builder.encode(" The pass key is"))}[task]
            assert find(case.prompt_ids, answer) == case.depth + offset
            if task == "kv":  # the key appears twice: in the record and in the query
                key = case.prompt_ids[case.depth + 1: case.depth + 1 + cases.KEY_TOKENS]
                assert find(case.prompt_ids[case.depth + 1:], key) is not None
                assert find(case.prompt_ids[: case.depth], key) is None  # no distractor repeats the key
    first, _ = builder.depth_range(task, 72)
    assert first == len(builder.prefix) + len(builder.pieces[task][0])  # depth 0: right after the instruction


def test_cases_are_reproducible_from_the_seed(builder):
    a, b = builder.make("kv", 80, 0.5, 3, 11), builder.make("kv", 80, 0.5, 3, 11)
    assert a == b
    assert builder.make("kv", 80, 0.5, 4, 11).prompt_ids != a.prompt_ids
    assert builder.make("kv", 80, 0.5, 3, 12).prompt_ids != a.prompt_ids


def test_too_short_a_length_and_a_bad_depth_are_one_line_errors(builder):
    from jaxroll.errors import ConfigError

    with pytest.raises(ConfigError, match="--lengths 10: too short for kv"):
        builder.make("kv", 10, 0.5, 0, 0)
    with pytest.raises(ConfigError, match="--depths"):
        builder.make("kv", 80, 1.5, 0, 0)


def plain_torch_scores(model, case):
    """Full logits over prompt + answer, float64 log-softmax, a loop over answer tokens: the oracle."""
    ids = torch.tensor([list(case.prompt_ids) + list(case.answer_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0].double()
    total, hits = 0.0, []
    for k, token in enumerate(case.answer_ids):
        row = logits[len(case.prompt_ids) - 1 + k]
        total += float(row[token] - torch.logsumexp(row, 0))
        hits.append(int(torch.argmax(row)) == token)
    return total, all(hits), sum(hits)


@pytest.mark.parametrize("family", ["llama", "bloom"])
def test_teacher_forced_scores_equal_a_plain_torch_computation(builder, family):
    model = tiny_model(family)
    grid_cases = [builder.make(task, length, f, s, 0) for task in cases.TASKS for length in (66, 70)
                  for f in (0.0, 1.0) for s in range(2)]
    rows = scoring.score_cases(model, grid_cases, batch_size=3)
    for case, row in zip(grid_cases, rows):
        logprob, exact, correct = plain_torch_scores(model, case)
        # float64 model, same arithmetic up to batching: 1e-10 nats
        assert row["logprob"] == pytest.approx(logprob, abs=1e-10)
        assert row["exact"] == exact and row["correct"] == correct
        assert row["key"] == case.key and row["prompt_ids"] == list(case.prompt_ids)


def test_exact_is_argmax_at_every_answer_token(builder):
    """A model made to predict the gold token at chosen answer positions: exact iff all are chosen."""
    case = builder.make("copy", 70, 0.5, 0, 0)
    answer = list(case.answer_ids)

    class Chosen(torch.nn.Module):
        def __init__(self, right):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))
            self.right = right

        def forward(self, input_ids, logits_to_keep, use_cache=False):
            logits = torch.zeros(input_ids.shape[0], logits_to_keep, VOCAB, dtype=torch.float64)
            for k, token in enumerate(answer):
                logits[:, k, token if k in self.right else (token + 1) % VOCAB] = 5.0
            return type("Output", (), {"logits": logits})

    for right, expected in ((set(range(len(answer))), True), (set(range(len(answer) - 1)), False), (set(), False)):
        row = scoring.score_cases(Chosen(right), [case])[0]
        assert row["exact"] is expected and row["correct"] == len(right)
        # closed form: log softmax of a one-hot logit 5 among VOCAB
        normaliser = np.log(np.exp(5.0) + VOCAB - 1)
        oracle = len(right) * (5.0 - normaliser) + (len(answer) - len(right)) * (0.0 - normaliser)
        assert row["logprob"] == pytest.approx(oracle, abs=1e-12)


def test_random_init_exact_match_is_at_chance(builder):
    """kv and copy answers are uniform draws from the pool: chance is pool^-A per case, far below 1/60 cases."""
    from scipy import stats

    model = tiny_model("bloom", torch.float32, seed=3)
    grid_cases = [builder.make(task, 80, f, s, 5) for task in ("kv", "copy") for f in np.linspace(0, 1, 5)
                  for s in range(6)]
    rows = scoring.score_cases(model, grid_cases, batch_size=10)
    pool = len(builder.pool)
    chance = pool ** -float(cases.VALUE_TOKENS)  # the larger of the two (kv has the shorter answer)
    exact = sum(row["exact"] for row in rows)
    assert exact <= stats.binom.ppf(1 - 1e-6, len(rows), chance)
    tokens = sum(len(row["answer_ids"]) for row in rows)
    correct = sum(row["correct"] for row in rows)
    # token by token the gold is one of `pool` tokens drawn uniformly: hits ~ Binomial(tokens, 1/pool)
    assert correct <= stats.binom.ppf(1 - 1e-6, tokens, 1 / pool)


class Oracle(torch.nn.Module):
    """Answers right when the record starts at or before `cutoff`, wrong (gold + 1) after it.

    It knows each case's answer and depth from a table keyed by the prompt, so the curve it must give is
    known in advance: exact = [depth <= cutoff], logprob in closed form.
    """

    def __init__(self, table, cutoff):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.table, self.cutoff, self.calls = table, cutoff, 0

    def forward(self, input_ids, logits_to_keep, use_cache=False):
        self.calls += input_ids.shape[0]
        logits = torch.zeros(input_ids.shape[0], logits_to_keep, VOCAB, dtype=torch.float64)
        for b, row in enumerate(input_ids.tolist()):
            prompt = tuple(row[: len(row) - logits_to_keep + 1])
            answer, depth = self.table[prompt]
            for k, token in enumerate(answer):
                logits[b, k, token if depth <= self.cutoff else (token + 1) % VOCAB] = 20.0
        return type("Output", (), {"logits": logits})


def oracle_for(builder, lengths, depths, samples, cutoff):
    table = {}
    for case in grid.grid_cases(builder, ["kv", "copy"], lengths, depths, samples, 0):
        table[case.prompt_ids] = (case.answer_ids, case.depth)
    return Oracle(table, cutoff)


def test_hand_made_model_gives_exactly_its_curve_and_a_resumed_grid_skips_done_cases(builder, tmp_path):
    lengths, depths = [64, 96], [0.0, 0.25, 0.5, 0.75, 1.0]
    cutoff = 40  # tokens: right for records starting at token <= 40, wrong after
    model = oracle_for(builder, lengths, depths, 3, cutoff)
    grid.run_grid(model, builder, tmp_path, tasks=["kv", "copy"], lengths=lengths, depths=depths, samples=2,
                  batch_size=4)
    assert model.calls == 2 * 2 * 5 * 2
    rows = grid.run_grid(model, builder, tmp_path, tasks=["kv", "copy"], lengths=lengths, depths=depths, samples=3,
                         batch_size=4)
    assert model.calls == 2 * 2 * 5 * 3  # only the third sample of each cell was scored again
    assert len(grid.read_rows(tmp_path / grid.CASES_FILE)) == len(rows) == 60
    table = summary.cells(rows)
    for cell in table:
        right = cell.depth <= cutoff
        assert cell.accuracy == float(right) and cell.count == 3
        answer_length = {"kv": cases.VALUE_TOKENS, "copy": cases.COPY_TOKENS - cases.COPY_CUE}[cell.task]
        normaliser = np.log(np.exp(20.0) + VOCAB - 1)
        assert cell.logprob == pytest.approx(answer_length * ((20.0 if right else 0.0) - normaliser), abs=1e-9)
        assert (cell.accuracy_low, cell.accuracy_high) == (float(right), float(right))  # no spread to resample
    # effective length by hand: depth-averaged accuracy of each length from the known cutoff
    for task in ("kv", "copy"):
        averages = {}
        for length in lengths:
            first, last = builder.depth_range(task, length)
            averages[length] = np.mean([first + round(f * (last - first)) <= cutoff for f in depths])
        assert summary.depth_average(table, task) == pytest.approx(averages)
        passing = [n for n, value in averages.items() if value >= 0.5]
        assert summary.effective_length(table, task) == (max(passing) if passing else None)


def test_always_right_model_is_right_everywhere(builder, tmp_path):
    model = oracle_for(builder, [64], [0.0, 0.5, 1.0], 2, cutoff=10**9)
    rows = grid.run_grid(model, builder, tmp_path, tasks=["kv", "copy"], lengths=[64], depths=[0.0, 0.5, 1.0],
                         samples=2)
    assert all(row["exact"] for row in rows)
    assert summary.effective_length(summary.cells(rows), "kv") == 64


def rows_with_curve(curve, profile_length=50, record=3, per_cell=4):
    """Synthetic scored rows: cell d has exact rate curve[d] (per_cell cases), record at evenly spread depths."""
    rows = []
    depths = np.linspace(0, profile_length - record, len(curve)).round().astype(int)
    for d, (depth, rate) in enumerate(zip(depths, curve)):
        hits = int(round(rate * per_cell))
        for s in range(per_cell):
            rows.append({"task": "kv", "length": profile_length, "depth": int(depth), "depth_fraction": d / 10,
                         "record_length": record, "exact": s < hits, "logprob": -1.0 + rate, "correct": s < hits,
                         "answer_ids": [1], "sample": s, "key": f"{d}/{s}"})
    return rows, depths


def test_bridge_recovers_a_monotone_link_and_its_ranks():
    profile = np.linspace(1.0, 3.0, 50) ** 2
    profile /= profile.sum()
    curve = np.array([0.0, 0.25, 0.25, 0.5, 0.75, 1.0])  # increasing in depth, as the profile
    rows, depths = rows_with_curve(curve)
    result = versus_influence.compare_task(rows, profile, score="exact")
    x = np.array([profile[d: d + 3].sum() for d in depths])
    np.testing.assert_allclose(result.influence, x, rtol=1e-12)
    # Spearman by hand: Pearson correlation of average ranks (ties share their mean rank)
    from scipy.stats import rankdata

    oracle = np.corrcoef(rankdata(x), rankdata(curve))[0, 1]
    assert result.spearman == pytest.approx(oracle, abs=1e-12)
    assert result.explained == pytest.approx(1.0, abs=1e-12)  # the ranks agree: isotonic fits exactly
    np.testing.assert_allclose(result.link, curve, atol=1e-12)
    reverse = versus_influence.compare_task(rows_with_curve(curve[::-1])[0], profile, score="exact")
    assert reverse.spearman == pytest.approx(-oracle, abs=1e-12)
    # a non-decreasing fit of a decreasing curve is its (weighted) mean: explains nothing
    np.testing.assert_allclose(reverse.link, np.mean(curve), atol=1e-12)
    assert reverse.explained == pytest.approx(0.0, abs=1e-12)
    assert reverse.spearman_high < 0 and any("runs against" in line for line in reverse.statement())


def test_flat_task_curve_has_no_rank_and_says_so():
    profile = np.full(50, 1 / 50)
    result = versus_influence.compare_task(rows_with_curve(np.full(6, 0.5))[0], profile)
    assert np.isnan(result.spearman)
    assert any("no curve to rank" in line for line in result.statement())


def bpe_tokenizer():
    """A byte-level BPE (GPT-2 style) trained offline on the templates and numbers, so digits merge unevenly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = np.random.default_rng(0)
    corpus = [cases._KV_HEADER, cases._PASSKEY_HEADER, cases._COPY_HEADER, cases._FILLER * 3,
              " The pass key is 12345. Remember it. What is the pass key?", ' "key": "value", Key: "x"'] + [
        " ".join(str(n) for n in rng.integers(0, 100000, 50)) for _ in range(20)] + [
        " ".join(rng.choice(WORDS, 40)) for _ in range(20)]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|endoftext|>",
                                                eos_token="<|endoftext|>")


def test_a_bpe_tokenizer_keeps_lengths_and_depths_exact_when_numbers_merge():
    bpe = cases.Builder(bpe_tokenizer())
    lengths = set()
    for sample in range(40):
        case = bpe.make("passkey", 220, 1.0, sample, 0)
        number = list(case.answer_ids)
        lengths.add(len(number))
        assert len(case.prompt_ids) == 220
        opening = len(bpe.encode(" The pass key is"))
        assert find(case.prompt_ids, number) == case.depth + opening
        # f = 1: the record ends right where the question starts
        query = bpe.pieces["passkey"][4]
        assert case.depth + case.record_length == 220 - len(query)
    assert len(lengths) > 1  # the numbers did take different numbers of tokens
    for task in ("kv", "copy"):
        case = bpe.make(task, 220, 0.5, 0, 0)
        assert len(case.prompt_ids) == 220 and find(case.prompt_ids, case.answer_ids) is not None


@pytest.mark.parametrize("family", sorted(__import__("jaxroll.measure.families", fromlist=["FAMILIES"]).FAMILIES)
                         + ["falcon_rope"])
def test_teacher_forced_scores_on_every_family_measure_supports(builder, family):
    """`jaxroll task` scores any family of `jaxroll.measure`: each tiny model's scores equal the
    plain full-logits computation. Tolerance 1e-8 nats in float64 (MPT's batched attention differs
    from one sequence at a time by ~1e-9 nats); Mixtral's grouped expert matmul has no float64
    kernel, so it runs in float32 (1e-4 nats). A wrong answer position or token is off by O(1)."""
    from test_families import _config

    config = _config(family)
    config.vocab_size = VOCAB
    for name in ("max_position_embeddings", "n_positions", "max_seq_len", "n_ctx"):
        if hasattr(config, name):
            setattr(config, name, 128)
    torch.manual_seed(0)
    dtype, tolerance = (torch.float32, 1e-4) if family == "mixtral" else (torch.float64, 1e-8)
    model = transformers.AutoModelForCausalLM.from_config(config).to(dtype).eval()
    chosen = [builder.make(task, 66, 0.5, 0, 0) for task in cases.TASKS]
    for case, row in zip(chosen, scoring.score_cases(model, chosen, batch_size=2)):
        logprob, exact, correct = plain_torch_scores(model, case)
        assert row["logprob"] == pytest.approx(logprob, abs=tolerance)
        assert row["exact"] == exact and row["correct"] == correct

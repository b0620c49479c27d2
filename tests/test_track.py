"""Tracking position bias from inside a training loop (issue 44): `jaxroll.track` and its Trainer callback.

A tiny BLOOM (with dropout, so that any random number drawn by the
measurement would change the training) is trained for a few steps on the
CPU by a real ``transformers.Trainer``; nothing is downloaded. The oracles:
the same run without the callback (the losses and the final weights must be
bit-identical), the steps that are multiples of k, and a count of the calls
to `jaxroll.measure.measure`.
"""

import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxroll  # noqa: E402
import jaxroll.measure.passes  # noqa: E402
from jaxroll.errors import ConfigError  # noqa: E402
from jaxroll.measure import tracking  # noqa: E402

VOCAB, N, S = 64, 12, 3
EVALUATION = np.random.default_rng(1).integers(0, VOCAB, size=(S, N))


def _model():
    torch.manual_seed(0)
    config = transformers.BloomConfig(n_layer=2, n_head=4, hidden_size=32, vocab_size=VOCAB, hidden_dropout=0.1,
                                      attention_dropout=0.1)
    return transformers.AutoModelForCausalLM.from_config(config)


class _Data(torch.utils.data.Dataset):
    def __init__(self):
        self.rows = torch.as_tensor(np.random.default_rng(2).integers(0, VOCAB, size=(16, N)))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return {"input_ids": self.rows[index], "labels": self.rows[index]}


def _train(tmp_path, name, steps=6, **tracked):
    """A Trainer run of `steps` steps; with `tracked`, a `track_trainer` callback. Returns (trainer, callback)."""
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path / name), max_steps=steps, per_device_train_batch_size=4, learning_rate=1e-2,
        logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=0, disable_tqdm=True,
        dataloader_num_workers=0)
    trainer = transformers.Trainer(model=_model(), args=arguments, train_dataset=_Data())
    callback = None
    if tracked:
        callback = tracking.track_trainer(trainer, EVALUATION, tmp_path / f"{name}-series", **tracked)
    trainer.train()
    return trainer, callback


def _losses(trainer):
    return [(entry["step"], entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]


@pytest.fixture
def calls(monkeypatch):
    """The (S, N) shapes `jaxroll.measure.measure` was called with."""
    seen = []
    original = jaxroll.measure.passes.measure

    def counting(model, sequences, **kwargs):
        seen.append(np.asarray(sequences).shape)
        return original(model, sequences, **kwargs)

    monkeypatch.setattr(jaxroll.measure.passes, "measure", counting)
    return seen


def test_the_callback_measures_at_multiples_of_k_and_leaves_training_bit_identical(tmp_path, calls, capsys,
                                                                                   one_torch_thread):
    plain, _ = _train(tmp_path, "plain")
    tracked, callback = _train(tmp_path, "tracked", every=3, queries=3)
    assert calls == [(S, N)] * 3  # steps 0, 3 and 6; nothing at 1, 2, 4, 5
    out = tmp_path / "tracked-series"
    assert sorted(path.name for path in out.iterdir() if path.name.startswith("checkpoint-")) == [
        "checkpoint-0", "checkpoint-3", "checkpoint-6"]
    series = jaxroll.measure.read_series(out)
    assert series["columns"]["step"] == [0, 3, 6] and series["arrays"]["measured"].shape == (3, N)
    assert "distance_exponent_measured" in series["columns"]
    assert (out / "series" / "series.png").is_file()  # drawn at the end of training
    # Logged through trainer.log at the measured steps.
    logged = [entry["step"] for entry in tracked.state.log_history if "jaxroll/w1_over_noise" in entry]
    assert logged == [0, 3, 6] and callback.calls == 3
    # The training is the same, to the bit: every logged loss and every final weight.
    assert len(_losses(plain)) == 6 and _losses(tracked) == _losses(plain)
    for (name, a), (_, b) in zip(plain.model.named_parameters(), tracked.model.named_parameters()):
        assert torch.equal(a, b), name
    assert tracked.model.training == plain.model.training
    assert "costs about" in capsys.readouterr().err


def test_the_callback_skips_with_one_warning_line_when_over_its_budget(tmp_path, calls, capsys, one_torch_thread):
    _train(tmp_path, "tight", steps=4, every=2, budget_seconds=1e-6)
    assert calls == [(1, N)]  # the first due call times one sequence; no measurement follows
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("jaxroll track:")]
    assert len(lines) == 3 and all("skipped" in line and "budget of 1e-06 s" in line for line in lines)
    assert [line.split()[3] for line in lines] == ["0", "2", "4"]
    out = tmp_path / "tight-series"
    assert not any(path.name.startswith("checkpoint-") for path in out.iterdir())
    assert not (out / "series" / "series.csv").exists()


def test_track_in_a_hand_written_loop_touches_nothing_before_k_steps(tmp_path, calls, one_torch_thread):
    model = _model()
    optimiser = torch.optim.SGD(model.parameters(), lr=1e-2)
    out = tmp_path / "loop"
    data = torch.as_tensor(EVALUATION)
    results = {}
    for step in range(1, 5):
        loss = model(input_ids=data, labels=data).loss
        loss.backward()
        optimiser.step()
        optimiser.zero_grad()
        results[step] = jaxroll.track(model, step, token_ids=EVALUATION, out=out, every=4)
        if step < 4:
            assert not out.exists() and calls == []
    assert results[1] is results[2] is results[3] is None
    assert set(results[4]) == {f"jaxroll/{name}" for name in tracking.SCALARS_LOGGED}
    assert calls == [(S, N)] and model.training
    assert jaxroll.measure.read_series(out)["columns"]["step"] == [4]
    assert jaxroll.track(model, 4, token_ids=EVALUATION, out=out, every=4) is None  # already measured
    assert calls == [(S, N)]


def test_a_measurement_leaves_mode_gradients_and_random_states_as_they_were(one_torch_thread):
    model = _model()
    model.train()
    loss = model(input_ids=torch.as_tensor(EVALUATION), labels=torch.as_tensor(EVALUATION)).loss
    loss.backward()
    grads = [parameter.grad.clone() for parameter in model.parameters()]
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    with tracking._untouched(model):  # a body that disturbs all of them
        model.eval()
        random.random(), np.random.rand(), torch.rand(3)
        for parameter in model.parameters():
            parameter.grad = None
            parameter.requires_grad_(False)
    assert model.training and all(parameter.requires_grad for parameter in model.parameters())
    assert all(torch.equal(parameter.grad, grad) for parameter, grad in zip(model.parameters(), grads))
    assert random.getstate() == states[0]
    assert np.array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2])


@pytest.mark.parametrize("every", [0, -3, 1.5])
def test_k_below_one_is_one_line_and_nothing_is_created(tmp_path, every):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"^every: got .*; allowed: an integer >= 1") as refused:
        tracking.track_callback(EVALUATION, out, every=every)
    assert "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match=r"^every: got"):
        jaxroll.track(None, 0, token_ids=EVALUATION, out=out, every=every)
    assert not out.exists()


@pytest.mark.parametrize("ids, budget", [(EVALUATION[:1], None), (EVALUATION.astype(float), None), (EVALUATION, 0)])
def test_bad_token_ids_or_budget_are_one_line(tmp_path, ids, budget):
    with pytest.raises(ConfigError, match=r"^(token_ids|budget_seconds): got "):
        jaxroll.track(None, 0, token_ids=ids, out=tmp_path / "out", every=1, budget_seconds=budget)
    assert not (tmp_path / "out").exists()

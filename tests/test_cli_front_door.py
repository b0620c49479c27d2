"""What a newcomer met at the front door (issue 32), run in-process through `jaxroll.cli.main`.

Bare ``jaxroll cache`` prints help; the torch error repeats the CPU-torch
advice; an all-zero profile is refused naming its file; ``fit`` treats a
preset, a published configuration and a config file alike when the profile's
length differs; a fit that ends at a bound says so; the identifiability
summary never calls a parameter determined and undetermined at once; the
fit's progress bar ends complete; ``measure`` waits before its first
progress line.
"""

import io
import sys
from pathlib import Path

import numpy as np
import pytest

import jaxroll
from jaxroll.cli import main

sys.path.insert(0, str(Path(__file__).parent))
import oracle  # noqa: E402


def run(capsys, *arguments):
    status = main([str(a) for a in arguments])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_bare_cache_prints_its_help_and_exits_0(capsys):
    status, out, err = run(capsys, "cache")
    assert status == 0 and err == ""
    assert out.startswith("usage: jaxroll cache") and "info" in out and "clear" in out
    status, _, err = run(capsys, "cache", "bogus")
    assert status == 2 and err.count("\n") == 1 and "cache: got 'bogus'; allowed: info, clear" in err


def test_measure_without_torch_repeats_the_cpu_torch_advice(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    status, _, err = run(capsys, "measure", tmp_path, "--texts", tmp_path / "t.txt", "--length", 8,
                         "--samples", 1, "--out", tmp_path / "out")
    assert status == 2 and err.count("\n") == 1
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in err and "jaxroll[measure]" in err
    assert not (tmp_path / "out").exists()


def test_an_all_zero_profile_is_refused_naming_its_file(tmp_path, capsys):
    zero = tmp_path / "zero.csv"
    zero.write_text("token_position,probability\n0,0\n1,0.0\n2,0\n")
    with pytest.raises(jaxroll.ConfigError, match=f"^{zero}: total mass is 0"):
        jaxroll.read_profile(zero)
    flat = jaxroll.write_profile(np.full(3, 1 / 3), tmp_path / "flat.csv")
    status, _, err = run(capsys, "compare", zero, flat)
    assert status == 2 and err.count("\n") == 1 and str(zero) in err


@pytest.mark.parametrize("start", [["--preset", "mpt-7b"], ["--published", "bloom-7b1"]])
def test_fit_from_a_preset_or_published_refuses_another_length_like_a_config(tmp_path, capsys, start):
    """The presets and published configurations have N = 256: a 20-point profile is
    refused with the config file's message (exit 2, one line, nothing written)
    unless --length says to fit at 20 (test_cli_fit.py fits a preset so)."""
    profile = jaxroll.write_profile(np.full(20, 1 / 20), tmp_path / "flat.csv")
    out = tmp_path / "out"
    status, _, err = run(capsys, "fit", profile, *start, "--out", out)
    assert status == 2 and err.count("\n") == 1 and not out.exists()
    assert "20 positions, but" in err and "has sequence_length 256" in err and "--length 20" in err
    if start[0] == "--published":
        assert "published bloom-7b1 (no content, fineweb-edu)" in err  # not "(none content, ...)"


def test_a_fit_that_ends_at_a_bound_says_so(tmp_path, capsys):
    """The target is the attention-only profile (every lambda = 1): a constant
    schedule can only approach it, so lambda_const ends at its upper bound.
    The summary names the bound (in the status line, a line of its own and a
    warning) and does not call lambda_const "not determined"."""
    n = 12
    start = jaxroll.RolloutModel.create(num_layers=2, num_heads=2, lambdas=0.5, alibi_slopes=[0.3, 0.1],
                                        sequence_length=n)
    config = jaxroll.save_config(start, tmp_path / "start.yaml")
    arrays = oracle.config_arrays(oracle.read_config(config))
    arrays["lambdas"] = np.ones_like(arrays["lambdas"])
    profile = jaxroll.write_profile(oracle.influence(arrays, n), tmp_path / "attention_only.csv")
    out = tmp_path / "out"
    status, printed, err = run(capsys, "fit", config, profile, "--schedule", "constant", "--search", 0,
                               "--restarts", 1, "--out", out, "--float64")
    assert status == 0, err
    fitted = oracle.read_config(out / "fitted.yaml")["lambda_schedule_config"]["lambda_const"]
    assert 1 - fitted <= 1e-5  # the case is what it claims to be
    assert "at a bound: lambda_const = " in printed and "(upper bound 1)" in printed
    first = printed.splitlines()[0]
    assert ("at a bound" in first) or ("not converged" in first)
    assert "not determined" not in printed
    assert "warning: the fit ended at a bound: lambda_const" in printed  # in the summary, not after it


def test_summary_calls_no_parameter_both_determined_and_not():
    """J = [[1, 1], [1, 1 + 1e-12]]: the sum a + b is determined, the difference
    is not, so neither a nor b is. The combination lines say "combination", each
    labelled by rho / s_k against the threshold (computed here with NumPy), and
    the warning explains that a determined combination fixes only itself."""
    from jaxroll.fitting.identification import identifiability_from_jacobian

    jacobian = np.array([[1.0, 1.0], [1.0, 1.0 + 1e-12], [0.0, 0.0]])
    report = identifiability_from_jacobian(jacobian, ["a", "b"], residual=1e-3, scale=1.0)
    singular = np.linalg.svd(jacobian, compute_uv=False)
    lines = report.summary()
    combinations = [line for line in lines if line.strip().startswith("combination")]
    assert len(combinations) == 2
    for line, s in zip(combinations, singular):
        determined = 1e-3 / s <= report.threshold
        assert (": determined to" in line) == determined and ("not determined" in line) == (not determined)
    determined_line = [line for line in lines if "determined parameters" in line]
    warning = [line for line in lines if line.startswith("warning:")]
    assert not determined_line and len(warning) == 1
    assert "a, b" in warning[0] and "fixes only the combination" in warning[0]


def test_summary_of_a_well_determined_fit_has_no_warning():
    from jaxroll.fitting.identification import identifiability_from_jacobian

    report = identifiability_from_jacobian(np.array([[1.0, 0.0], [0.0, 2.0]]), ["a", "b"], residual=1e-3, scale=1.0)
    lines = report.summary()
    assert not any(line.startswith("warning:") for line in lines)
    assert any("determined parameters (to +-0.1): a +-0.001, b +-0.0005" in line for line in lines)


def _constant_fit(progress):
    n = 12
    model = jaxroll.RolloutModel.create(num_layers=2, num_heads=2, lambdas=0.3, alibi_slopes=[0.3, 0.1],
                                        sequence_length=n)
    truth = jaxroll.RolloutModel.create(num_layers=2, num_heads=2, lambdas=0.6, alibi_slopes=[0.3, 0.1],
                                        sequence_length=n)
    target = np.asarray(jaxroll.influence(truth), np.float64)
    return jaxroll.fit(model, target, schedule="constant", loss="kl", steps=500, restarts=1, search=0,
                       progress=progress)


def test_the_fit_progress_bar_ends_complete(monkeypatch):
    """On a terminal: a fit that converges in a few of its 500 steps ends its
    bar at n = total (100%), with how it stopped, not frozen at "1%"."""
    import tqdm.auto

    bars = []

    class Recorded(tqdm.auto.tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.update(delay=0, file=io.StringIO())
            super().__init__(*args, **kwargs)
            bars.append(self)

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    from jaxroll.progress import Progress

    monkeypatch.setattr(tqdm.auto, "tqdm", Recorded)
    progress = Progress(500, stream=Terminal(), label="jaxroll fit", unit="steps")
    result = _constant_fit(progress)
    assert result.converged and result.steps < 500
    (bar,) = bars
    assert bar.n == bar.total == result.steps
    assert "stop=converged" in bar.fp.getvalue().split("\r")[-1]


def test_progress_off_a_terminal_writes_lines_without_carriage_returns():
    """Issue 46: the one progress convention (jaxroll.progress): off a terminal
    (a log, a pipe) newline-terminated lines and never a carriage return, at
    most one every min_seconds, and a closing line; the fit's count ends at
    the steps it took, with how it stopped."""
    from jaxroll.progress import Progress

    stream = io.StringIO()
    result = _constant_fit(Progress(500, stream=stream, label="jaxroll fit", unit="steps"))
    text = stream.getvalue()
    assert text and "\r" not in text and text.endswith("\n")
    last = text.splitlines()[-1]
    assert last.startswith(f"jaxroll fit: {result.steps}/{result.steps} steps (100%)") and "stop=converged" in last
    # A fast job on a fake clock: 100 updates in 50 s, lines at most every 5 s.
    stream, clock = io.StringIO(), Clock()
    with Progress(100, stream=stream, clock=clock, label="jaxroll sweep", unit="chunks") as progress:
        for _ in range(100):
            clock.now += 0.5
            progress.update(1)
    lines = stream.getvalue().splitlines(keepends=True)
    assert all(line.endswith("\n") and "\r" not in line for line in lines)
    assert 2 <= len(lines) <= 50 / 5 + 1 and lines[-1].startswith("jaxroll sweep: 100/100 chunks (100%)")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_measure_progress_prints_no_line_before_its_delay():
    """A job of 20 sequences in 0.5 s: with delay 2 s only the closing line
    (not 20 lines); a job of 20 sequences in 20 s prints its 5% lines after 2 s,
    at most one every 5 s."""
    from jaxroll.measure.progress import Progress

    for seconds in (0.025, 1.0):
        stream, clock = io.StringIO(), Clock()
        with Progress(20, stream=stream, clock=clock, delay=2.0) as progress:
            for _ in range(20):
                clock.now += seconds
                progress.update(1)
        lines = stream.getvalue().splitlines()
        # 1 s per sequence: 5% lines from 2 s on, at most one per 5 s (at 2, 7, 12 and 17 s), then
        # the closing line.
        assert len(lines) == (1 if seconds < 0.1 else 5), lines
        assert lines[-1].startswith("jaxroll measure: 20/20 sequences (100%)")


def test_measure_command_waits_before_its_first_progress_line(tmp_path, capsys, monkeypatch):
    """`jaxroll measure` on a tiny model (built offline, tests/tiny_tokenizer.py)
    makes its Progress with the command's 2 s delay; a job this short prints at
    most a few progress lines (here: those after 2 s, if the machine is slow)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tiny_tokenizer import WORDS, word_level_tokenizer

    from jaxroll.cli import measure as command
    from jaxroll.measure import progress as progress_module

    made = []

    class Recorded(progress_module.Progress):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(progress_module, "Progress", Recorded)
    torch.manual_seed(0)
    model_dir = tmp_path / "bloom"
    config = transformers.BloomConfig(n_layer=1, n_head=2, hidden_size=16, vocab_size=64)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(model_dir)
    word_level_tokenizer().save_pretrained(model_dir)
    rng = np.random.default_rng(0)
    texts = tmp_path / "docs.txt"
    texts.write_text("\n\n".join(" ".join(rng.choice(WORDS, size=12)) for _ in range(20)) + "\n", encoding="utf-8")
    status, _, err = run(capsys, "measure", model_dir, "--texts", texts, "--length", 8, "--samples", 20,
                         "--stats", "lambda", "--out", tmp_path / "out")
    assert status == 0, err
    (progress,) = made
    assert progress.delay == command.PROGRESS_DELAY == 2.0
    lines = [line for line in err.splitlines() if line.startswith("jaxroll measure: ")]
    elapsed = progress.clock() - progress.start
    assert lines and lines[-1].startswith("jaxroll measure: 20/20 sequences")
    if elapsed < command.PROGRESS_DELAY:
        assert len(lines) == 1, lines  # a sub-2-second job: the closing line only

"""Nothing is created on refusal: every command, refused with bad input, exits 2 and leaves the tree as it was.

One walk over the commands of `jaxroll.cli` (one module each, plus ``presets``,
``compare``, ``forces``, ``fit-kernel``, ``score``): each case names an
``--out`` two directories deep that does not exist, and the whole temporary
tree is compared before and after. Refusals that come only after ``--out``
was made (a model that fails while measuring, a fit that fails while fitting)
are forced with a ConfigError raised from inside the run.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from jaxroll.cli import main

COMMANDS = ("rollout", "presets", "measure", "compare", "forces", "fit", "fit-kernel", "sweep", "kinetic", "score",
            "cache", "effect", "design", "series")


def _tree(root):
    return sorted((os.path.relpath(path, root), tuple(sorted(files))) for path, _, files in os.walk(root))


def _refused(argv, root, capsys):
    before = _tree(root)
    try:
        code = main([str(item) for item in argv])
    except SystemExit as exit_:  # argparse's own exits (none expected: the parser raises ConfigError)
        code = exit_.code
    err = capsys.readouterr().err.strip()
    assert code == 2, (argv, err)
    assert err.count("\n") == 0 and err.startswith("jaxroll: error:"), (argv, err)
    assert _tree(root) == before, (argv, err)
    return err


@pytest.fixture
def files(tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    profile = inputs / "p.csv"
    profile.write_text("token_position,probability\n" + "".join(f"{j},{1 / 16}\n" for j in range(16)),
                       encoding="utf-8")
    broken = inputs / "broken.yaml"
    broken.write_text("sequence_length: [\n", encoding="utf-8")
    spec = inputs / "spec.yaml"
    spec.write_text("base: {preset: nope}\n", encoding="utf-8")
    return {"profile": profile, "broken": broken, "spec": spec, "missing": inputs / "missing"}


def cases(files, out):
    p, broken, spec, missing = files["profile"], files["broken"], files["spec"], files["missing"]
    return {
        "rollout": [["rollout", "--preset", "nope", "--out", out], ["rollout", broken, "--out", out],
                    ["rollout", "--preset", "mpt-7b", "--length", 0, "--out", out],
                    ["rollout", "--preset", "mpt-7b", "--device", "npu", "--out", out]],
        "presets": [["presets", "--bogus"]],
        "compare": [["compare", p, missing], ["compare", p, broken],
                    ["compare", p, p, "--out", p],
                    ["compare", p, p, "--out", out, "--measured", missing]],
        "forces": [["forces", "--preset", "mpt-7b", "--length", -3, "--out", out], ["forces", broken, "--out", out]],
        "fit": [["fit", "--preset", "mpt-7b", missing, "--out", out],
                ["fit", "--preset", "mpt-7b", p, "--steps", 0, "--out", out],
                ["fit", "--preset", "mpt-7b", p, "--fit", "gain", "--out", out],
                ["fit", "--preset", "mpt-7b", broken, p, "--out", out]],
        "fit-kernel": [["fit-kernel", "--preset", "mpt-7b", "--heads", 0, "--out", out],
                       ["fit-kernel", "--preset", "mpt-7b", "--family", "nope", "--out", out]],
        "sweep": [["sweep", missing, "--out", out], ["sweep", spec, "--out", out], ["sweep", broken, "--out", out]],
        "kinetic": [["kinetic", "--beta", -1, "--out", out], ["kinetic", "--length", 0, "--out", out]],
        "score": [["score", p, "--measured", missing], ["score", missing, "--measured", missing]],
        "cache": [["cache", "bogus"]],
        "effect": [["effect", "--measured", missing, "--measured", missing, "--predicted", p, "--out", out],
                   ["effect", "--measured", p.parent, "--measured", p.parent, "--predicted", broken, "--out", out]],
        "design": [["design", "--preset", "mpt-7b", "--free", "bogus=global", "--goal", "middle_mass", "--out", out],
                   ["design", "--preset", "mpt-7b", "--free", "tau=global", "--goal", "middle_mass",
                    "--kl-budget", -1, "--out", out]],
        "series": [["series", "--measured", missing], ["series", "--measured", p.parent]],
        "measure": [["measure", missing, "--texts", p, "--length", 8, "--samples", 2, "--out", out],
                    ["measure", p.parent, "--texts", p, "--length", 8, "--samples", 2, "--out", out]],
    }


def test_every_refusal_of_every_command_leaves_the_tree_unchanged(files, tmp_path, capsys):
    out = tmp_path / "new" / "out"
    table = cases(files, out)
    assert set(table) == set(COMMANDS)
    for command, argvs in table.items():
        for argv in argvs:
            _refused(argv, tmp_path, capsys)
    assert not (tmp_path / "new").exists()


def test_a_refusal_after_out_was_made_removes_it(files, tmp_path, capsys, monkeypatch):
    """A ConfigError from inside the run (after prepare_output_dir) still leaves nothing behind."""
    import importlib

    from jaxroll import ConfigError

    def refuse(*args, **kwargs):
        raise ConfigError("fit: refused from inside the run")

    monkeypatch.setattr(importlib.import_module("jaxroll.fitting"), "fit", refuse)
    out = tmp_path / "new" / "out"
    err = _refused(["fit", "--preset", "mpt-7b", files["profile"], "--length", 16, "--out", out], tmp_path, capsys)
    assert "inside the run" in err
    # An existing --out (empty) stays: only what the refused command created goes.
    kept = tmp_path / "kept"
    kept.mkdir()
    _refused(["fit", "--preset", "mpt-7b", files["profile"], "--length", 16, "--out", kept], tmp_path, capsys)
    assert kept.is_dir()


# A model folder holding only config.json, its fields as transformers 5 writes them (the committed
# validation/models/wave5 configs): the refusals below need nothing else, and no torch.
LLAMA = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "head_dim": 16, "hidden_act": "silu",
         "hidden_size": 64, "intermediate_size": 256, "max_position_embeddings": 64, "model_type": "llama",
         "num_attention_heads": 4, "num_hidden_layers": 4, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
         "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "vocab_size": 1024}
BLOOM = {"architectures": ["BloomForCausalLM"], "hidden_size": 64, "model_type": "bloom", "n_head": 4, "n_layer": 4,
         "vocab_size": 1024}
MPT = {"architectures": ["MptForCausalLM"], "model_type": "mpt", "d_model": 16, "n_heads": 2, "n_layers": 2,
       "max_seq_len": 32, "vocab_size": 64, "attn_config": {"clip_qkv": None, "alibi": True}}


@pytest.fixture
def config_only(tmp_path, monkeypatch):
    """Folders with a config.json only, and torch and transformers made unimportable (`import` raises)."""
    import json
    import sys

    for name, fields in (("llama", LLAMA), ("bloom", BLOOM), ("mpt", MPT)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(fields), encoding="utf-8")
    (tmp_path / "texts.txt").write_text("one two three\n", encoding="utf-8")
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "transformers", None)
    return tmp_path


EARLY = [  # issue 56's three examples, then the other refusals config.json and the flags decide
    (["measure", "llama", "--intervene", "slope_scale=0.5"], "slope_scale: a llama model has rope positions"),
    (["measure", "bloom", "--queries", "3,999"], "queries: position 999; allowed: positions in [0, 63]"),
    (["measure", "bloom", "--refine", "bogus"], "--refine: got 'bogus'"),
    (["measure", "bloom", "--stats", "lambda,bogus"], "--stats: got 'bogus'; allowed: a subset of lambda"),
    (["measure", "bloom", "--row-target", "hidden"], "--row-target hidden: without --queries"),
    (["measure", "bloom", "--intervene", "sinks=2", "--queries", "3"], "--queries: with sinks=2"),
    (["measure", "mpt", "--intervene", "tau=0.7"], "--length: 64; allowed: at most the model's max_seq_len (32)"),
    (["measure", "llama", "--intervene", "rotary_ratio=2", "--resume"], "--resume: no checkpoint.npz"),
    (["task", "llama", "--intervene", "slope_scale=0.5"], "slope_scale: a llama model has rope positions"),
    (["task", "mpt", "--lengths", "30"], "--lengths: 30; allowed: at most the model's max_seq_len (32) minus 8"),
    (["task", "bloom", "--depths", "2"], "--depths: got 2.0"),
    (["task", "bloom", "--resume"], "--resume: no cases.jsonl"),
]


@pytest.mark.parametrize("argv, message", EARLY, ids=[" ".join(argv) for argv, _ in EARLY])
def test_argument_errors_are_refused_before_torch_and_transformers_import(argv, message, config_only, capsys):
    """With `import torch` and `import transformers` failing, the refusal is still the argument's own (not
    "needs torch"), in one line with exit 2, and nothing is created."""
    model = config_only / argv[1]
    extra = (["--texts", config_only / "texts.txt", "--length", 64, "--samples", 2] if argv[0] == "measure"
             else [])
    err = _refused([argv[0], model, *argv[2:], *extra, "--out", config_only / "new" / "out"], config_only, capsys)
    assert message in err and "needs torch" not in err, err


def test_a_fresh_process_refuses_without_loading_torch_or_transformers(tmp_path):
    """The three examples in one fresh interpreter, whose `sys.modules` then holds neither (a stricter
    check than the monkeypatch above, which cannot see a module an earlier test already imported)."""
    import json
    import subprocess
    import sys

    for name, fields in (("llama", LLAMA), ("bloom", BLOOM)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(fields), encoding="utf-8")
    (tmp_path / "t.txt").write_text("one two three\n", encoding="utf-8")
    script = f"""
import sys
from jaxroll.cli import main
for command, model, *flags in {[argv for argv, _ in EARLY[:4]]!r}:
    argv = [command, {str(tmp_path)!r} + "/" + model, *flags, "--texts", "t.txt", "--length", "64", "--samples", "2"]
    assert main([*argv, "--out", "out"]) == 2
print(sorted(name for name in ("torch", "transformers") if name in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
    assert done.stderr.count("jaxroll: error:") == 4 and "slope_scale" in done.stderr and "--stats" in done.stderr


def test_the_config_json_stand_in_decides_as_the_transformers_config(tmp_path):
    """`config_json` against AutoConfig on the committed models: the same plan for every intervention
    (or the same refusal), and None where config.json lacks what transformers would fill in."""
    transformers = pytest.importorskip("transformers")
    import json
    from pathlib import Path

    from jaxroll import ConfigError
    from jaxroll.interventions import parse
    from jaxroll.measure.torch_plan import check, config_json, position_limit

    root = Path(__file__).resolve().parent.parent / "validation" / "models" / "wave5"
    for name in ("bloom-trained", "llama-trained"):
        stand_in = config_json(root / name)
        real = transformers.AutoConfig.from_pretrained(root / name, local_files_only=True)
        assert position_limit(stand_in) == position_limit(real)
        for text in ("tau=0.7", "slope_scale=0.5", "rotary_ratio=2", "gamma=0.5", "kappa=-0.1", "ssmax_scale=1.2"):
            outcomes = []
            for config in (stand_in, real):
                try:
                    plan = check(parse(text), config)
                    outcomes.append((plan.family, plan.gammas is None, plan.change is None))
                except ConfigError as error:
                    outcomes.append(str(error))
            assert outcomes[0] == outcomes[1], (name, text, outcomes)
    fields = dict(LLAMA)
    del fields["num_hidden_layers"]  # transformers would fill in 32
    (tmp_path / "config.json").write_text(json.dumps(fields), encoding="utf-8")
    assert config_json(tmp_path) is None
    assert config_json(tmp_path / "missing") is None


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Tiny MPT and Gemma 2 directories with a word-level tokenizer."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tiny_tokenizer import word_level_tokenizer

    root = tmp_path_factory.mktemp("models")
    configs = {"mpt": transformers.MptConfig(n_layers=2, n_heads=2, d_model=16, vocab_size=64, max_seq_len=32),
               "gemma2": transformers.Gemma2Config(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                                   hidden_size=16, intermediate_size=24, vocab_size=64, head_dim=8)}
    for name, config in configs.items():
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(root / name)
        word_level_tokenizer().save_pretrained(root / name)
    return root


@pytest.fixture
def texts(tmp_path):
    from tiny_tokenizer import WORDS

    rng = np.random.default_rng(0)
    path = tmp_path / "inputs" / "docs.txt"
    path.parent.mkdir(exist_ok=True)
    path.write_text("\n\n".join(" ".join(rng.choice(WORDS, size=20)) for _ in range(3)) + "\n", encoding="utf-8")
    return path


def test_measure_refusals_leave_nothing_and_mpt_refines(models, texts, tmp_path, capsys, monkeypatch):
    out = tmp_path / "new" / "out"
    base = ["--texts", texts, "--length", 12, "--samples", 2, "--quiet", "--out", out]
    # The issue's bug: MPT with --refine was refused after --out was made; now it runs.
    assert main([str(item) for item in ["measure", models / "mpt", *base, "--refine", "position,mlp,norm,heads"]]) == 0, \
        capsys.readouterr().err
    assert (out / "refined.csv").is_file()
    capsys.readouterr()
    out2 = tmp_path / "new2" / "out"
    base2 = [*base[:-1], out2]
    for argv in (["--stats", "lambda,content"], ["--refine", "gain"], ["--stats", "lambda,entropy"]):
        err = _refused(["measure", models / "gemma2", *base2, *argv], tmp_path, capsys)
        assert "allowed" in err or "not defined" in err, err
    # Gemma 2's post-attention norm no longer refuses the head refinements (issue 46).
    out3 = tmp_path / "gemma-refined"
    assert main([str(item) for item in ["measure", models / "gemma2", *base[:-1], out3, "--refine", "norm,heads"]]) \
        == 0, capsys.readouterr().err
    assert (out3 / "refined.csv").is_file()
    capsys.readouterr()
    # Refused while measuring (after --out was made): nothing left either.
    import jaxroll.measure as measure_module
    from jaxroll import ConfigError

    def refuse(*args, **kwargs):
        raise ConfigError("measure: refused while measuring")

    monkeypatch.setattr(measure_module, "measure", refuse)
    _refused(["measure", models / "mpt", *base2], tmp_path, capsys)
    assert not out2.parent.exists()


def _command_parsers():
    from jaxroll.cli import _build_parser

    parser = _build_parser()
    return next(action for action in parser._subparsers._group_actions).choices


@pytest.mark.parametrize("command", COMMANDS + ("task", "compare-task"))
def test_a_misspelt_option_names_the_command_and_the_closest_option(command, tmp_path, capsys):
    """Every long option of every command, with two letters swapped: exit 2, one line naming the command
    and (difflib's oracle, run here on the subparser's own options) the option meant."""
    import difflib

    options = sorted(option for option in _command_parsers()[command]._option_string_actions
                     if option.startswith("--") and len(option) >= 6 and option != "--help")
    checked = 0
    for option in options:
        typo = option[:3] + option[4] + option[3] + option[5:]  # "--length" -> "--elngth"
        if typo in options or difflib.get_close_matches(typo, options, n=1, cutoff=0.6) != [option]:
            continue
        assert main([command, typo, "1"]) == 2, typo
        err = capsys.readouterr().err
        assert err == f"jaxroll: error: {command}: unrecognized arguments: {typo} 1; did you mean {option}?\n" or \
            err == f"jaxroll: error: {command}: unrecognized arguments: {typo}; did you mean {option}?\n", err
        checked += 1
    assert checked >= min(len(options), 1), command


def test_the_issues_example_and_an_option_like_no_other(capsys):
    assert main(["rollout", "--lenght", "8"]) == 2
    assert capsys.readouterr().err == "jaxroll: error: rollout: unrecognized arguments: --lenght; did you mean --length?\n"
    assert main(["presets", "--zzzzzz"]) == 2
    assert capsys.readouterr().err == ("jaxroll: error: presets: unrecognized arguments: --zzzzzz; allowed: --help, "
                                       "--json (see --help)\n")
    assert main(["rollout", "--lenght=8", "--forse"]) == 2
    assert capsys.readouterr().err == ("jaxroll: error: rollout: unrecognized arguments: --lenght=8 --forse; did you "
                                       "mean --length for --lenght, --force for --forse?\n")

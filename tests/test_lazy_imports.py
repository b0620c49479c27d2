"""Lazy imports: `import jaxroll` loads no JAX, a rollout loads no optax,
matplotlib, pandas or torch, and `jaxroll --help`, `--version` and argument
errors answer before JAX loads. Each check runs in a fresh interpreter and
reads its sys.modules (the test process has imported everything already).
"""

import json
import subprocess
import sys
import types

import pytest

import jaxroll

HEAVY = ("jax", "equinox", "optax", "matplotlib", "matplotlib.pyplot", "pandas", "torch", "transformers",
         "jaxroll.measure", "jaxroll.fitting", "jaxroll.sweeps", "jaxroll.plot")


def loaded_after(code: str) -> tuple[set[str], subprocess.CompletedProcess]:
    """The HEAVY modules in sys.modules after running `code` in a fresh interpreter."""
    script = (f"import sys, json\ntry:\n" + "".join(f"    {line}\n" for line in code.splitlines())
              + f"except SystemExit:\n    pass\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.strip().splitlines()[-1])), result


def test_import_jaxroll_loads_nothing_heavy():
    loaded, _ = loaded_after("import jaxroll")
    assert loaded == set()


def test_a_rollout_loads_jax_but_no_fit_figures_tables_or_torch():
    loaded, _ = loaded_after("import jaxroll\n"
                             "model = jaxroll.published.load('mpt-7b')\n"
                             "p = jaxroll.influence(model, 16)\n"
                             "jaxroll.load_config(jaxroll.published.path('mpt-7b')); jaxroll.presets.get('mpt-7b')")
    assert {"jax", "equinox"} <= loaded
    assert loaded.isdisjoint({"optax", "matplotlib", "pandas", "torch", "transformers",
                              "jaxroll.measure", "jaxroll.fitting", "jaxroll.sweeps", "jaxroll.plot"})


@pytest.mark.parametrize("figure", [False, True])
def test_the_rollout_command_loads_matplotlib_only_for_its_figure_and_never_pyplot(tmp_path, figure):
    out = tmp_path / "out"
    loaded, _ = loaded_after(f"from jaxroll.cli import main\nassert main(['rollout', '--preset', 'mpt-7b', '--length', "
                             f"'8', '--out', {str(out)!r}{'' if figure else ', ' + repr('--no-figure')}]) == 0")
    assert ("matplotlib" in loaded) == figure and ("jaxroll.plot" in loaded) == figure
    assert "matplotlib.pyplot" not in loaded  # a Figure on an Agg canvas: no pyplot, no backend
    assert (out / "profile.png").exists() == figure


@pytest.mark.parametrize("arguments", [["--help"], ["--version"], ["rollout", "--help"], ["fit", "--help"],
                                       ["rollout", "--preset", "no-such-model"], ["no-such-command"]])
def test_help_version_and_argument_errors_answer_before_jax(arguments):
    loaded, result = loaded_after(f"from jaxroll.cli import main\nstatus = main({arguments!r})\n"
                                  "print('status', status)")
    assert "jax" not in loaded and "equinox" not in loaded
    if "--help" in arguments or "--version" in arguments:
        assert ("usage: jaxroll" in result.stdout) or result.stdout.startswith("jaxroll ")
    else:  # one line on stderr, exit status 2
        assert "status 2" in result.stdout
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("jaxroll: error: ")


def test_every_public_name_resolves_and_dir_lists_them():
    assert set(jaxroll.__all__) <= set(dir(jaxroll))
    for name in jaxroll.__all__:
        assert getattr(jaxroll, name) is not None, name
    assert isinstance(jaxroll.__version__, str)
    with pytest.raises(AttributeError):
        jaxroll.no_such_name  # noqa: B018


def test_fit_and_sweep_stay_the_functions_after_their_modules_are_imported():
    import jaxroll.fitting  # noqa: F401  (binds the submodule on the package, which must not win)
    import jaxroll.sweeps  # noqa: F401

    assert not isinstance(jaxroll.fit, types.ModuleType) and callable(jaxroll.fit)
    assert not isinstance(jaxroll.sweep, types.ModuleType) and callable(jaxroll.sweep)
    assert jaxroll.fit is sys.modules["jaxroll.fitting"].fit
    assert jaxroll.sweep is sys.modules["jaxroll.sweeps"].sweep
    assert jaxroll.SweepResult is sys.modules["jaxroll.sweeps"].SweepResult


def test_the_parser_names_equal_the_modules_names():
    from jaxroll import fit as _  # noqa: F401
    from jaxroll import presets, published
    from jaxroll.fitting import kernel_fit
    from jaxroll.cli import _names

    fit_module = sys.modules["jaxroll.fitting"]
    assert list(_names.PRESETS) == presets.names() and _names.DEFAULT_PRESET == presets.DEFAULT
    assert list(_names.PUBLISHED) == published.names() and tuple(_names.DATASETS) == tuple(published.DATASETS)
    assert tuple(_names.FIT_FIELDS) == tuple(fit_module.FIELDS)
    assert tuple(_names.FIT_SCHEDULES) == tuple(fit_module.SCHEDULES)
    assert tuple(_names.FIT_CONTENTS) == tuple(fit_module.CONTENTS)
    assert tuple(_names.FIT_LOSSES) == tuple(fit_module.LOSSES)
    assert tuple(_names.KERNEL_FAMILIES) == tuple(kernel_fit.FAMILIES)


def test_no_public_function_is_shadowed_by_a_module_of_its_name():
    """Issue 42: `jaxroll.fit`, `jaxroll.sweep` and `jaxroll.measure.measure` are functions; no submodule
    of a package has the name of a callable the package exports (importing it would rebind the name)."""
    import importlib
    import pkgutil

    import jaxroll

    shadowed = []
    for package_name in ("jaxroll", "jaxroll.measure", "jaxroll.theory", "jaxroll.task", "jaxroll.fitting",
                         "jaxroll.sweeps", "jaxroll.plot", "jaxroll.engine"):
        package = importlib.import_module(package_name)
        modules = {info.name for info in pkgutil.iter_modules(package.__path__)}
        for name in getattr(package, "__all__", ()):
            if name in modules and not name[0].isupper() and callable(getattr(package, name, None)) \
                    and not isinstance(getattr(package, name), types.ModuleType):
                shadowed.append(f"{package_name}.{name}")
    assert not shadowed and jaxroll.fit.__module__.startswith("jaxroll.fitting.")

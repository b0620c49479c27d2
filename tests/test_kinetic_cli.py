"""``jaxroll kinetic``: outputs, numbers against the library, one-line errors that create nothing."""

import numpy as np
import pytest

from jaxroll import cli
from jaxroll.theory import kinetic


def test_kinetic_command_writes_profile_rollout_and_figure(tmp_path, capsys):
    out = tmp_path / "k"
    assert cli.main(["kinetic", "--beta", "1", "--lambda", "1", "--depth", "2", "--length", "48", "--layers", "16",
                     "--float64", "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"kinetic.csv", "profile.csv", "config.yaml", "kinetic.png"}
    table = np.loadtxt(out / "kinetic.csv", delimiter=",", skiprows=1)
    np.testing.assert_allclose(table[:, 2], np.asarray(kinetic.profile(table[:, 1], 2.0, 1.0, 1.0, 8.0)), rtol=1e-12)
    assert table[:, 3].sum() == pytest.approx(1.0, abs=1e-12)
    printed = capsys.readouterr().out
    assert "t_crit = 2.45748898" in printed   # the reference 2.457489
    assert "interior minimum" in printed


@pytest.mark.parametrize("arguments,message", [
    (["--beta", "0"], "--beta"), (["--depth", "-1"], "--depth"), (["--lambda", "nan"], "--lambda"),
    (["--depth", "40", "--beta", "3", "--layers", "4"], "--layers"), (["--length", "2"], "--length"),
])
def test_bad_input_is_one_line_and_creates_nothing(tmp_path, capsys, arguments, message):
    out = tmp_path / "never"
    assert cli.main(["kinetic", *arguments, "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("jaxroll: error: ") and message in error and "\n" not in error
    assert not out.exists()

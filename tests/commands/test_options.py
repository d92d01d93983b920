"""The shared options: one definition per flag, each command's own wording and defaults kept."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.commands import options as opt

runner = CliRunner()


def test_a_flag_gives_its_usual_help_when_the_command_says_nothing() -> None:
    info = opt.verbose()
    assert info.param_decls == ("--verbose", "-v")
    assert info.default is False
    assert info.help == opt.VERBOSE_HELP


def test_a_command_sets_its_own_help_and_default_and_keeps_the_flags_bound() -> None:
    info = opt.timeout("Seconds per HTTP request (--url).", default=10.0)
    assert info.param_decls == ("--timeout",)
    assert info.default == 10.0
    assert info.min == 0.1
    assert info.help == "Seconds per HTTP request (--url)."
    assert opt.timeout("x").default is None  # the override is this call's, never the shared definition's


@pytest.mark.parametrize("command", ["check", "watch", "drill"])
def test_a_shared_bound_holds_in_every_command_that_takes_the_flag(command: str) -> None:
    res = runner.invoke(app, [command, "--tenants", "0"])
    assert res.exit_code == 2, res.output
    assert "--tenants" in res.output

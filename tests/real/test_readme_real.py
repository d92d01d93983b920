"""The real-server commands of the README and docs/usage.md, exactly as shown, with what the text says (real tier).

tests/test_readme_drift.py checks that REAL_COMMANDS is every README command that needs the real server.
A command another real test already runs with the same flags names that test instead of starting
another real pair (the tier's cost is a budget: tests/real/README.md).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from tests.assets.real_sglang import server_env_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.real]
runner = CliRunner()
HERE = Path(__file__).resolve().parent

# command as README.md or docs/ shows it -> (release, the exit codes the text gives it, the real test that runs it)
REAL_COMMANDS: dict[str, tuple[str, tuple[int, ...], str | None]] = {
    # "The gate must fail (exit 1)"
    "drill --engine sglang --release 0.5.19": (
        "0.5.19",
        (1,),
        "test_cli_real.py::test_drill_on_real_0_5_19_blocks_and_names_the_served_request",
    ),
    # "A healthy pool passes on 0.5.22 (exit 0)"
    "drill --engine sglang --release 0.5.22 --prefill-pool 10240": ("0.5.22", (0,), None),
    # `up --gate` "exits with the gate's status": a healthy 0.5.22 pair passes at the defaults, no profile
    "up --device cpu --release 0.5.22 --context-length 8192 --prefill-pool 10240 --decode-pool 10240 --gate": (
        "0.5.22",
        (0,),
        "test_cli_real.py::test_up_gate_on_a_healthy_real_0_5_22_pair_passes_at_the_defaults",
    ),
}


def test_covering_tests_exist_and_run_the_same_command() -> None:
    for command, (_, codes, covered_by) in REAL_COMMANDS.items():
        if covered_by is None:
            continue
        file, name = covered_by.split("::")
        source = (HERE / file).read_text()
        assert f"def {name}(" in source, covered_by
        body = source.split(f"def {name}(", 1)[1].split("\ndef ", 1)[0]
        for word in shlex.split(command):
            assert f'"{word}"' in body, (covered_by, word)
        assert any(f"exit_code == {c}" in body or f"exit_code in {codes}" in body for c in codes), covered_by


@pytest.mark.parametrize("command", [c for c, (_, _, by) in REAL_COMMANDS.items() if by is None])
def test_readme_real_command(command: str) -> None:
    release, codes, _ = REAL_COMMANDS[command]
    server_env_or_skip(release)
    res = runner.invoke(app, [*shlex.split(command), "-q"])
    assert res.exit_code in codes, res.output

"""The README's real-server commands, exactly as shown, with what the text says of them (real tier).

tests/test_readme_drift.py checks that this list is every README command that needs the real server.
"""

from __future__ import annotations

import shlex

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from tests.assets.real_sglang import server_env_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.real]
runner = CliRunner()

# command (as shown in README.md) -> (release, the exit codes the text gives it)
REAL_COMMANDS: dict[str, tuple[str, tuple[int, ...]]] = {
    # "The gate must fail (exit 1)"
    "drill --engine sglang --emulate 0.5.19": ("0.5.19", (1,)),
    # "A healthy pool passes on 0.5.22 (exit 0)"
    "drill --engine sglang --emulate 0.5.22 --prefill-pool 10240": ("0.5.22", (0,)),
    # `up --gate` "exits with the gate's status": a healthy 0.5.22 pair is never blocked (3 only for what a
    # CPU pair cannot show, as tests/real/test_cli_real.py holds)
    "up --device cpu --release 0.5.22 --context-length 8192 --prefill-pool 10240 --decode-pool 10240 --gate": (
        "0.5.22",
        (0, 3),
    ),
}


@pytest.mark.parametrize("command", list(REAL_COMMANDS))
def test_readme_real_command(command: str) -> None:
    release, codes = REAL_COMMANDS[command]
    server_env_or_skip(release)
    res = runner.invoke(app, [*shlex.split(command), "-q"])
    assert res.exit_code in codes, res.output

"""Microsoft's SARIF multitool (npm `@microsoft/sarif-multitool`), installed once into the kvgate cache like
the sglang wheels, and run with GitHub code scanning's own rules (`validate --rule-kind "Sarif;Gh"`).

The npm package ships a self-contained binary per platform; its `bin.js` passes arguments through a
shell (a `;` in `Sarif;Gh` would split the command), so the binary is run directly.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

from kvgate.paths import cache_dir
from kvgate.upstream.releases import locked

VERSION = "5.7.0"
PACKAGE = f"@microsoft/sarif-multitool@{VERSION}"


class Unavailable(Exception):
    """The multitool could not be installed (no npm, or the registry did not answer)."""


def _binary(prefix: Path) -> Path:
    plat = {"Linux": "linux", "Darwin": "darwin", "Windows": "win32"}[platform.system()]
    name = "Sarif.Multitool.exe" if plat == "win32" else "Sarif.Multitool"
    return prefix / "node_modules" / "@microsoft" / f"sarif-multitool-{plat}" / name


def multitool() -> Path:
    """The multitool binary, installed on first use under $KVGATE_CACHE_DIR/npm (file-locked)."""
    prefix = cache_dir() / "npm" / f"sarif-multitool-{VERSION}"
    exe = _binary(prefix)
    if exe.is_file():
        return exe
    prefix.mkdir(parents=True, exist_ok=True)
    with locked(prefix.with_suffix(".lock")):
        if not exe.is_file():
            npm = shutil.which("npm")
            if npm is None:
                raise Unavailable("npm is not installed (apt-get install -y nodejs npm)")
            proc = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--prefix", str(prefix), PACKAGE],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if proc.returncode != 0 or not exe.is_file():
                raise Unavailable(f"npm install {PACKAGE} failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
        exe.chmod(exe.stat().st_mode | 0o100)  # its postinstall (chmod u+x) is not run by every npm
    return exe


def github_errors(sarif: Path, workdir: Path) -> list[dict[str, Any]]:
    """The results of level `error` the multitool's SARIF and GitHub rules report on `sarif`."""
    out = workdir / f"{sarif.stem}.validation.sarif"
    out.unlink(missing_ok=True)
    proc = subprocess.run(
        [str(multitool()), "validate", "--rule-kind", "Sarif;Gh", "--output", str(out), str(sarif)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.is_file(), f"the multitool wrote no result (rc {proc.returncode}): {proc.stdout[-3000:]}"
    doc = json.loads(out.read_text(encoding="utf-8-sig"))
    results = [r for run in doc["runs"] for r in run.get("results", [])]
    # A result without a level is a warning (SARIF's default); notifications of a broken run are errors too.
    errors = [r for r in results if r.get("level") == "error"]
    for run in doc["runs"]:
        for inv in run.get("invocations", []):
            errors += [n for n in inv.get("toolExecutionNotifications", []) if n.get("level") == "error"]
    return errors

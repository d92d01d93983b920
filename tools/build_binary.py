"""Build `dist/kvgate`: one executable file holding kvgate and its core dependencies (a shiv zipapp).

    python3 tools/build_binary.py

Runs from a clean checkout with nothing but python3 (>= 3.10) and the package index: it makes its
own build environment in build/binary-venv (shiv, pinned), has shiv pip-install this project with
its core dependencies only (typer, rich, httpx, gitpython, pyyaml, packaging; no extras) into a
zipapp, and prints the file's path and size. The file runs on any machine with python3 >= 3.10 on
PATH, no virtual environment needed; on first run it unpacks into ~/.shiv (SHIV_ROOT moves it).

Why a shiv zipapp and not PyInstaller onefile: every core dependency is pure Python (PyYAML falls
back to its pure loader), so a zipapp is portable across CPython versions and platforms; it builds
in seconds with one pinned tool; it is a few MB, not tens; and it starts as fast as an installed
kvgate once unpacked, where a PyInstaller onefile re-extracts its interpreter on every run. The
price is that the target machine needs a python3, which every CI image that runs pip has.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIV = "shiv==1.0.8"


def build(output: Path, build_dir: Path) -> Path:
    """Build the zipapp at `output`; return it.

    Safe to run twice at once (two test workers, two CI steps): builds take turns on a lock in
    `build_dir`, and the file appears at `output` whole (written beside it, then renamed).
    """
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        env_dir = build_dir / "binary-venv"
        py = env_dir / "bin" / "python"
        if not py.exists():
            venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", SHIV], check=True)
        output.parent.mkdir(parents=True, exist_ok=True)
        partial = output.with_name(output.name + ".partial")
        subprocess.run(
            [
                str(env_dir / "bin" / "shiv"),
                "--console-script",
                "kvgate",
                "--output-file",
                str(partial),
                "--python",
                "/usr/bin/env python3",
                "--compressed",
                "--reproducible",
                "--disable-pip-version-check",
                "-q",
                str(ROOT),
            ],
            check=True,
        )
        os.replace(partial, output)
    return output


def main() -> None:
    ap = argparse.ArgumentParser(description="Build dist/kvgate, a single-file kvgate (shiv zipapp).")
    ap.add_argument("--output", type=Path, default=ROOT / "dist" / "kvgate")
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build")
    args = ap.parse_args()
    out = build(args.output.resolve(), args.build_dir.resolve())
    size = out.stat().st_size
    print(f"built {out} ({size / 1e6:.1f} MB)")


if __name__ == "__main__":
    sys.exit(main())

"""Build `dist/kvgate`: one executable file holding kvgate and its pure-Python core dependencies.

    python3 tools/build_binary.py

Runs from a clean checkout with nothing but python3 (>= 3.10) and the package index. It builds
kvgate's wheel, has pip resolve the core dependencies (typer, rich, httpx, gitpython, pyyaml,
packaging) for the OLDEST supported Python (3.10, so that every `python_version < ...` backport such
as `exceptiongroup` is in), keeps only pure Python (PyYAML's optional C loader is dropped: PyYAML
falls back to its pure one; any other compiled file fails the build), and zips the result behind a
launcher (tools/binary_main.py) into a zipapp. The one file runs on CPython 3.10-3.13, tested on each
by tests/test_binary.py; on first run it unpacks into ~/.cache/kvgate-bin (KVGATE_BIN_ROOT moves it).

typer is pinned to BINARY_PINS below: typer >= 0.29 needs pydantic, whose compiled pydantic_core
ties a bundle to the one CPython it was built on (and needs 3.11); typer 0.28 is pure Python.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = Path(__file__).with_name("binary_main.py")
OLDEST_PYTHON = "3.10"
# Pins for the file only (the installed package keeps its ranges): pure-Python versions that run on 3.10-3.13.
BINARY_PINS = ("typer==0.28.0",)
# Compiled files a dependency may ship that the file drops, because the package falls back to pure Python.
DROPPABLE = ("yaml/_yaml.",)
# A fixed timestamp for every member: no build time in the file.
ZIP_TIME = (2026, 1, 1, 0, 0, 0)


def _pip(build_dir: Path) -> list[str]:
    """A pip to run: this interpreter's, else one in a build venv (a bare python3 may have none)."""
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0:
        return [sys.executable, "-m", "pip"]
    env_dir = build_dir / "binary-venv"
    py = env_dir / "bin" / "python"
    if not py.exists():
        venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    return [str(py), "-m", "pip"]


def stage(build_dir: Path) -> Path:
    """kvgate and its dependencies, resolved for the oldest supported Python, pure Python only."""
    pip = [*_pip(build_dir), "--disable-pip-version-check", "-q"]
    wheels = build_dir / "binary-wheels"
    site = build_dir / "binary-site"
    for d in (wheels, site):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(ROOT)], check=True)
    (wheel,) = wheels.glob("kvgate-*.whl")
    _install_for_oldest(pip, site, str(wheel), *BINARY_PINS)
    _complete_markers(pip, site)
    compiled = []
    for path in sorted(site.rglob("*")):
        rel = path.relative_to(site).as_posix()
        if path.suffix in (".so", ".pyd", ".dylib"):
            if rel.startswith(DROPPABLE):
                path.unlink()
            else:
                compiled.append(rel)
        elif path.name == "__pycache__" or rel == "bin":
            shutil.rmtree(path, ignore_errors=True)
    if compiled:
        raise SystemExit(f"compiled files would tie the file to one CPython: {', '.join(compiled)}")
    if (site / "pydantic_core").exists():
        raise SystemExit("pydantic_core got into the file (is typer pinned to a pure-Python release?)")
    return site


SUPPORTED = ("3.10", "3.11", "3.12", "3.13")


def _missing_for_some_python(site: Path) -> set[str]:
    """Requirements whose marker holds on a supported Python but that are not in `site`.

    pip evaluates environment markers against the interpreter running it, whatever --python-version
    says: built on 3.11, `exceptiongroup; python_version < "3.11"` would be left out, and the file
    would break on 3.10.
    """
    sys.path.insert(0, str(site))
    try:
        from packaging.markers import default_environment
        from packaging.requirements import Requirement
        from packaging.utils import canonicalize_name
    finally:
        sys.path.remove(str(site))
    present = {canonicalize_name(d.name.split("-")[0]) for d in site.glob("*.dist-info")}
    missing: set[str] = set()
    for meta in site.glob("*.dist-info/METADATA"):
        for line in meta.read_text(encoding="utf-8").splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            for version in SUPPORTED:
                env = {**default_environment(), "python_version": version, "python_full_version": version + ".0"}
                env["extra"] = ""
                if (req.marker is None or req.marker.evaluate(env)) and canonicalize_name(req.name) not in present:
                    missing.add(f"{req.name}{req.specifier}")
    return missing


def _install_for_oldest(pip: list[str], site: Path, *args: str) -> None:
    """pip install `args` into `site` as the oldest supported Python would have them, wheels only."""
    target = ["--target", str(site), "--python-version", OLDEST_PYTHON, "--only-binary", ":all:", "--no-compile"]
    subprocess.run([*pip, "install", *target, *args], check=True)


def _complete_markers(pip: list[str], site: Path) -> None:
    """Add what a supported Python needs that the resolving interpreter did not (to a fixed point)."""
    for _ in range(5):
        missing = _missing_for_some_python(site)
        if not missing:
            return
        _install_for_oldest(pip, site, "--upgrade", *sorted(missing))
    raise SystemExit(f"dependencies for some supported Python still missing: {_missing_for_some_python(site)}")


def pack(site: Path, output: Path) -> str:
    """Zip `site` behind the launcher into `output` (executable); return the build id."""
    files = sorted(p for p in site.rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for p in files:
        digest.update(p.relative_to(site).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    build_id = digest.hexdigest()
    launcher = LAUNCHER.read_text(encoding="utf-8").replace("@BUILD_ID@", build_id)
    with open(output, "wb") as raw:
        raw.write(b"#!/usr/bin/env python3\n")
        with zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(zipfile.ZipInfo("__main__.py", ZIP_TIME), launcher)
            for p in files:
                info = zipfile.ZipInfo("site/" + p.relative_to(site).as_posix(), ZIP_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                zf.writestr(info, p.read_bytes())
    output.chmod(0o755)
    return build_id


def build(output: Path, build_dir: Path) -> Path:
    """Build the zipapp at `output`; return it.

    Safe to run twice at once (two test workers, two CI steps): builds take turns on a lock in
    `build_dir`, and the file appears at `output` whole (written beside it, then renamed).
    """
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        site = stage(build_dir)
        output.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(prefix=output.name + ".", dir=output.parent)
        os.close(fd)
        try:
            pack(site, Path(partial))
            os.replace(partial, output)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return output


def main() -> None:
    ap = argparse.ArgumentParser(description="Build dist/kvgate, a single-file kvgate for CPython 3.10-3.13.")
    ap.add_argument("--output", type=Path, default=ROOT / "dist" / "kvgate")
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build")
    args = ap.parse_args()
    out = build(args.output.resolve(), args.build_dir.resolve())
    size = out.stat().st_size
    print(f"built {out} ({size / 1e6:.1f} MB; CPython 3.10-3.13)")


if __name__ == "__main__":
    sys.exit(main())

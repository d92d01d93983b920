"""Detection by source signatures in an installed sglang package (method 3).

What is on the disk the server runs from decides: a fork with backports reads as what it is. The
package is found from a site-packages folder, by asking an interpreter where it imports sglang from,
or in the interpreter kvgate runs in.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kvgate.catalogue.model import Catalogue, Detection
from kvgate.catalogue.signatures import DirTree
from kvgate.errors import UsageError

_VERSION_RX = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.MULTILINE)

# Run inside the operator's interpreter: find_spec locates the package without importing it.
_ASK = (
    "import importlib.util, json\n"
    "s = importlib.util.find_spec('sglang')\n"
    "print(json.dumps({'origin': s.origin if s else None,"
    " 'locations': list(s.submodule_search_locations or []) if s else []}))\n"
)


@dataclass(frozen=True)
class InstalledSglang:
    """An sglang package folder (the one holding `srt/`), its declared version, and how it was found."""

    package_dir: Path
    version: str | None
    found_by: str


def _is_package_dir(p: Path) -> bool:
    return (p / "srt").is_dir() and ((p / "__init__.py").is_file() or (p / "_version.py").is_file())


def read_declared_version(package_dir: Path) -> str | None:
    """`__version__` from sglang/_version.py or version.py, else the dist-info next to the package."""
    for name in ("_version.py", "version.py"):
        try:
            m = _VERSION_RX.search((package_dir / name).read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        if m:
            return m.group(1)
    for meta in sorted(package_dir.parent.glob("sglang-*.dist-info/METADATA")):
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def from_site_packages(path: Path) -> InstalledSglang:
    """A site-packages folder (or unpacked wheel) holding `sglang/`, or the `sglang/` folder itself."""
    path = Path(path).expanduser()
    for cand in (path / "sglang", path):
        if _is_package_dir(cand):
            cand = cand.resolve()
            return InstalledSglang(cand, read_declared_version(cand), f"--site-packages {path}")
    if not path.exists():
        raise UsageError(f"--site-packages {path}: no such directory")
    raise UsageError(f"--site-packages {path}: no sglang package there (expected {path}/sglang/srt)")


def from_python(interpreter: str, timeout: float = 60.0) -> InstalledSglang:
    """Ask `interpreter` where it would import sglang from (without importing it)."""
    try:
        proc = subprocess.run([interpreter, "-I", "-c", _ASK], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise UsageError(f"--python {interpreter}: no such interpreter") from None
    except (PermissionError, OSError) as exc:
        raise UsageError(f"--python {interpreter}: cannot run it ({exc})") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"--python {interpreter}: did not answer within {timeout:.0f} s") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"--python {interpreter}: failed ({tail})")
    try:
        info = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise UsageError(f"--python {interpreter}: unexpected answer {proc.stdout[-200:]!r}") from None
    for loc in info.get("locations") or []:
        if _is_package_dir(Path(loc)):
            p = Path(loc).resolve()
            return InstalledSglang(p, read_declared_version(p), f"--python {interpreter}")
    raise UsageError(f"--python {interpreter}: sglang is not importable by that interpreter")


def auto_detect() -> InstalledSglang:
    """The sglang importable by the interpreter kvgate runs in."""
    spec = importlib.util.find_spec("sglang")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if _is_package_dir(Path(loc)):
            p = Path(loc).resolve()
            return InstalledSglang(p, read_declared_version(p), f"auto-detected by {sys.executable}")
    raise UsageError(
        f"no sglang importable by {sys.executable}; give --site-packages PATH, --python INTERPRETER, "
        "--repo PATH, --version X or --url SERVER"
    )


def detect_by_source(cat: Catalogue, installed: InstalledSglang) -> dict[str, Detection]:
    """Method 3 for every catalogue entry: match signatures in the installed package."""
    results = DirTree(installed.package_dir).scan(cat.fixes)
    where = str(installed.package_dir)
    out: dict[str, Detection] = {}
    for fix in cat.fixes:
        r = results[fix.id]
        out[fix.id] = Detection(fix.id, "source", r.presence, (f"package {where}",) + r.evidence())
    return out

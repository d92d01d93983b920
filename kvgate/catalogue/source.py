"""Detection by source signatures in the sglang package a server runs (method 3).

What is on the disk the server runs from decides: a fork with backports reads as what it is. The
package is read through a code scan (kvgate.catalogue.codescan): in this process for a site-packages
folder or this interpreter, through `--python CMD` for another interpreter, container or host.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kvgate.catalogue import scanprog
from kvgate.catalogue.codescan import (
    SCAN_TIMEOUT_S,
    CodeScan,
    all_series,
    glob_id,
    parse_answer,
    pattern_of,
    scan_command,
    scan_site_packages,
)
from kvgate.catalogue.model import Catalogue, Detection, Presence, load_catalogue
from kvgate.catalogue.series import Series
from kvgate.catalogue.signatures import SignatureHit, SignatureResult
from kvgate.errors import UsageError

_VERSION_RX = scanprog.VERSION_RX


def read_declared_version(package_dir: Path) -> str | None:
    """`__version__` from sglang/_version.py or version.py, else the dist-info next to the package."""
    return scanprog.declared_version(str(package_dir))[0]


def from_site_packages(path: Path, cat: Catalogue | None = None) -> CodeScan:
    """A site-packages folder (or unpacked wheel) holding `sglang/`, or the `sglang/` folder itself."""
    return scan_site_packages(path, cat or load_catalogue())


def from_python(command: str, cat: Catalogue | None = None, timeout: float = SCAN_TIMEOUT_S) -> CodeScan:
    """The sglang that `command` (an interpreter, or a wrapper running one remotely) would import."""
    return scan_command(command, cat or load_catalogue(), timeout=timeout)


def auto_detect(cat: Catalogue | None = None, series: tuple[Series, ...] | None = None) -> CodeScan:
    """The sglang importable by the interpreter kvgate runs in."""
    from kvgate.catalogue.codescan import build_request

    doc = scanprog.scan(build_request(cat or load_catalogue(), series if series is not None else all_series()))
    if doc.get("error"):
        raise UsageError(
            f"no sglang importable by {sys.executable}; give --site-packages PATH, --python COMMAND, "
            "--repo PATH, --version X or --url SERVER"
        )
    return parse_answer(doc, f"auto-detected by {sys.executable}")


def signature_results(cat: Catalogue, scan: CodeScan) -> dict[str, SignatureResult]:
    """Every upstream entry's signatures matched against the scan."""
    out: dict[str, SignatureResult] = {}
    for fix in cat.upstream():
        hits = []
        for sig in fix.signatures:
            if sig.is_glob:
                hits.append(SignatureHit(sig, tuple(scan.globs.get(glob_id(sig), ()))))
                continue
            hit = scan.hit(sig.file, pattern_of(sig))
            hits.append(SignatureHit(sig, (sig.file,) if hit else (), file_missing=scan.files.get(sig.file) is None))
        out[fix.id] = SignatureResult(fix.id, tuple(hits))
    return out


def detect_by_source(cat: Catalogue, scan: CodeScan) -> dict[str, Detection]:
    """Method 3 for every upstream entry (backports: kvgate.catalogue.backports)."""
    where = f"package {scan.package_dir} ({scan.source})"
    return {
        fid: Detection(fid, "source", r.presence, (where,) + r.evidence())
        for fid, r in signature_results(cat, scan).items()
    }


__all__ = [
    "Presence",
    "auto_detect",
    "detect_by_source",
    "from_python",
    "from_site_packages",
    "read_declared_version",
    "signature_results",
]

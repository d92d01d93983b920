"""A two-file backport series of our own over a tiny fake sglang tree, for the engine's write paths.

Not sglang: a few lines standing in for its files, so the apply/revert transaction (temp files, backups,
the applied.json marker) runs in milliseconds without a wheel. The real series are tested on the real
wheels in tests/backport.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

from kvgate.catalogue.series import Series, load_series

RELEASE = "0.5.20"
FILES = {
    "python/sglang/srt/door.py": ("def admit(req):\n    return True\n", "def admit(req):\n    return req.ok  # door\n"),
    "python/sglang/srt/conn.py": ("RELEASE = 'late'\n", "RELEASE = 'early'  # conn\n"),
}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _diff(path: str, before: str, after: str) -> str:
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    body = "".join("-" + line for line in old) + "".join("+" + line for line in new)
    return f"--- a/{path}\n+++ b/{path}\n@@ -1,{len(old)} +1,{len(new)} @@\n{body}"


def make_series(root: Path) -> Series:
    """backports/v0.5.20 under `root` with one patch touching both FILES."""
    directory = root / f"v{RELEASE}"
    directory.mkdir(parents=True)
    (directory / "0001.patch").write_text("".join(_diff(p, b, a) for p, (b, a) in FILES.items()))
    manifest = {
        "series": f"v{RELEASE}-hostile",
        "base_release": RELEASE,
        "patches": [
            {
                "id": "hostile-door",
                "file": "0001.patch",
                "title": "a test patch",
                "optional": False,
                "stands_in_for": [],
                "fixes": "nothing",
                "files": [
                    {"path": p, "sha256_before": _sha(b), "sha256_after": _sha(a), "code": [a.split("#")[1].strip()]}
                    for p, (b, a) in FILES.items()
                ],
            }
        ],
    }
    (directory / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return load_series(RELEASE, root=root)


def make_site(root: Path) -> Path:
    """A site-packages folder whose sglang/ holds FILES at their base release."""
    for path, (before, _) in FILES.items():
        dest = root / path.removeprefix("python/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(before)
    return root


def tree(root: Path) -> dict[str, str]:
    """Every entry under `root`: file contents, and symlink targets as 'link -> target'."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = f"link -> {p.readlink()}"
        elif p.is_file():
            out[rel] = p.read_text(errors="replace")
    return out

"""A backport series as data: backports/v<release>/manifest.yaml plus its unified diffs.

It lives in the catalogue because the catalogue recognises a backport by the code its series adds
(kvgate/catalogue/backports.py); kvgate.backport, a layer above, applies and reverts the same series.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from kvgate.catalogue.scanprog import MARKER_PREFIX
from kvgate.errors import UsageError
from kvgate.output.safeio import confine, relative_part
from kvgate.paths import backports_dir

_RELEASE = re.compile(r"^v?(\d+\.\d+\.\d+)$")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class PatchFile:
    """One file a patch changes: its path in a git checkout, the hashes before and after, and the code
    signatures (substrings the patch adds to this file) that recognise the change in any tree."""

    path: str
    sha256_before: str
    sha256_after: str
    code: tuple[str, ...] = ()

    @property
    def site_path(self) -> str:
        """The same file in a site-packages layout (`python/sglang/x` -> `sglang/x`)."""
        return self.path[len("python/") :] if self.path.startswith("python/") else self.path


@dataclass(frozen=True)
class Patch:
    """One patch of a series."""

    id: str
    file: Path
    title: str
    optional: bool
    stands_in_for: tuple[str, ...]
    fixes: str
    files: tuple[PatchFile, ...]

    @property
    def signatures(self) -> tuple[str, ...]:
        """Every file's code signatures, in file order, each once."""
        return tuple(dict.fromkeys(c for f in self.files for c in f.code))

    def diff_text(self) -> str:
        return self.file.read_text(encoding="utf-8")


@dataclass(frozen=True)
class Series:
    """A release's patch series, in application order."""

    name: str
    base_release: str
    directory: Path
    patches: tuple[Patch, ...]

    def select(self, with_hardening: bool) -> tuple[Patch, ...]:
        """The patches to apply: all mandatory ones, the optional (hardening) ones only on request."""
        chosen = tuple(p for p in self.patches if with_hardening or not p.optional)
        # Optional patches must come last so the mandatory set is a prefix of the full series.
        ids = [p.id for p in self.patches]
        assert [p.id for p in chosen] == ids[: len(chosen)], "optional patches must be last in the manifest"
        return chosen


def normalise_release(value: str) -> str:
    """'v0.5.20' or '0.5.20' -> '0.5.20'."""
    m = _RELEASE.match(value.strip())
    if not m:
        raise UsageError(f"--to {value!r}: expected a release like v0.5.20")
    return m.group(1)


def available() -> list[str]:
    """Releases that have a series under backports/."""
    root = backports_dir()
    if not root.is_dir():
        return []
    return sorted(p.name[1:] for p in root.iterdir() if (p / "manifest.yaml").is_file())


# Every key a manifest may carry, each read below: a field nothing reads is refused, not kept as decoration.
_SERIES_KEYS = {"series", "base_release", "patches"}
_PATCH_KEYS = {"id", "file", "title", "optional", "stands_in_for", "fixes", "files"}
_FILE_KEYS = {"path", "sha256_before", "sha256_after", "code"}


def _known_keys(raw: dict, allowed: set[str], where: str) -> None:
    unread = sorted(set(raw) - allowed)
    if unread:
        raise ValueError(
            f"{where}: unknown key(s) {', '.join(unread)} (kvgate reads only {', '.join(sorted(allowed))})"
        )


def _patch_file(raw: dict, patch_id: str, where: Path) -> PatchFile:
    _known_keys(raw, _FILE_KEYS, f"{patch_id}: {raw.get('path')}")
    code = tuple(str(c) for c in raw.get("code") or ())
    if not code or any(not c.strip() or MARKER_PREFIX.strip() in c for c in code):
        raise ValueError(
            f"{patch_id}: {raw.get('path')}: `code` must list the substrings the patch adds "
            "(never the marker): a backport is recognised by its code"
        )
    path = relative_part(raw["path"], f"{where}: {patch_id}", Path("the sglang tree"))
    return PatchFile(path, raw["sha256_before"], raw["sha256_after"], code)


def load_series(release: str, root: Path | None = None) -> Series:
    """Load and validate backports/v<release>/manifest.yaml (exit 2 on a missing or broken manifest)."""
    release = normalise_release(release)
    directory = (root or backports_dir()) / f"v{release}"
    path = directory / "manifest.yaml"
    if not path.is_file():
        have = ", ".join(f"v{r}" for r in available()) or "none"
        raise UsageError(f"no backport series for v{release} (available: {have})")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        _known_keys(data, _SERIES_KEYS, "top level")
        if data.get("base_release") != release:
            raise ValueError(f"base_release is {data.get('base_release')!r}, expected {release!r}")
        patches = []
        for raw in data["patches"]:
            _known_keys(raw, _PATCH_KEYS, f"patch {raw.get('id')}")
            diff = confine(directory, raw["file"], path)
            if not diff.is_file():
                raise ValueError(f"patch file {raw['file']} is missing")
            patches.append(
                Patch(
                    id=str(raw["id"]),
                    file=diff,
                    title=str(raw["title"]),
                    optional=bool(raw.get("optional", False)),
                    stands_in_for=tuple(raw.get("stands_in_for", ())),
                    fixes=str(raw.get("fixes", "")),
                    files=tuple(_patch_file(f, str(raw["id"]), path) for f in raw["files"]),
                )
            )
    except (KeyError, TypeError, ValueError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: invalid manifest: {exc}") from exc
    return Series(
        name=str(data.get("series", f"v{release}")), base_release=release, directory=directory, patches=tuple(patches)
    )

"""Maintainer tool: recompute a series' manifest hashes from the real release wheel.

`python -m kvgate.backport.regen v0.5.20 [--write]` applies the series' diffs in order to the files of
the unpacked sglang wheel and prints (or writes) each patch's `files` list: which files it changes,
their sha256 before and after. Run it after editing a patch; everything else in the manifest (each
file's `code`) is kept.
"""

from __future__ import annotations

import sys
from typing import TypedDict

import yaml

from kvgate.backport.diffapply import apply, parse
from kvgate.catalogue.series import load_series, normalise_release, sha256_bytes
from kvgate.output.safeio import write_atomic
from kvgate.upstream.releases import unpacked_wheel


class FileHashes(TypedDict):
    """One file a patch changes, with its sha256 before and after the patch."""

    path: str
    sha256_before: str
    sha256_after: str


class PatchHashes(TypedDict):
    """One patch of the series and the files it changes."""

    id: str
    files: list[FileHashes]


def recompute(release: str) -> list[PatchHashes]:
    """Per patch, in order: {"id", "files": [{"path", "sha256_before", "sha256_after"}]} from the wheel."""
    release = normalise_release(release)
    series = load_series(release)
    root = unpacked_wheel(release)
    state: dict[str, bytes] = {}
    out: list[PatchHashes] = []
    for patch in series.patches:
        files: list[FileHashes] = []
        for d in parse(patch.diff_text()):
            site_rel = d.path[len("python/") :] if d.path.startswith("python/") else d.path
            before = state.get(d.path) or (root / site_rel).read_bytes()
            after = apply(before.decode("utf-8"), d).encode("utf-8")
            state[d.path] = after
            files.append({"path": d.path, "sha256_before": sha256_bytes(before), "sha256_after": sha256_bytes(after)})
        out.append({"id": patch.id, "files": files})
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m kvgate.backport.regen vX.Y.Z [--write]", file=sys.stderr)
        return 2
    release = normalise_release(args[0])
    fresh = {p["id"]: p["files"] for p in recompute(release)}
    path = load_series(release).directory / "manifest.yaml"
    text = path.read_text(encoding="utf-8")
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    data = yaml.safe_load(text)
    for patch in data["patches"]:
        code = {f["path"]: f.get("code") for f in patch["files"]}  # hand-written: kept
        patch["files"] = [{**f, "code": code.get(f["path"])} for f in fresh[patch["id"]]]
    rendered = header + yaml.safe_dump(data, sort_keys=False, width=110)
    if "--write" in args:
        write_atomic(path, rendered)
        print(f"wrote {path}")
    else:
        sys.stdout.write(rendered)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

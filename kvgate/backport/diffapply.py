"""A strict unified-diff applier for in-memory file contents.

Strict on purpose: the engine has already checked each file's sha256 against the manifest, so every
hunk must apply at its stated line with its exact context. Anything else is an error, never a fuzzy
match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchApplyError(Exception):
    """A hunk did not match the file it was meant for."""


@dataclass(frozen=True)
class FileDiff:
    """The hunks of one file: (old start line, old lines, new lines) each."""

    path: str
    hunks: tuple[tuple[int, tuple[str, ...], tuple[str, ...]], ...]


def parse(diff_text: str) -> list[FileDiff]:
    """Split a (git-style) unified diff into per-file hunks; paths drop the a/ b/ prefixes."""
    files: list[FileDiff] = []
    lines = diff_text.splitlines(keepends=True)
    i = 0
    path: str | None = None
    hunks: list[tuple[int, tuple[str, ...], tuple[str, ...]]] = []

    def flush() -> None:
        if path is not None:
            files.append(FileDiff(path, tuple(hunks)))

    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            flush()
            target = lines[i + 1][4:].rstrip("\n").split("\t")[0]
            path = target[2:] if target.startswith("b/") else target
            hunks = []
            i += 2
            continue
        m = _HUNK.match(line)
        if m and path is not None:
            old_n = int(m.group(2) or "1")
            new_n = int(m.group(4) or "1")
            old: list[str] = []
            new: list[str] = []
            i += 1
            while (len(old) < old_n or len(new) < new_n) and i < len(lines):
                body = lines[i]
                if body.startswith("\\"):  # "\ No newline at end of file"
                    i += 1
                    continue
                tag, text = body[:1], body[1:]
                if tag in (" ", ""):
                    old.append(text if tag else "\n")
                    new.append(text if tag else "\n")
                elif tag == "-":
                    old.append(text)
                elif tag == "+":
                    new.append(text)
                else:
                    raise PatchApplyError(f"{path}: malformed hunk line {body!r}")
                i += 1
            hunks.append((int(m.group(1)), tuple(old), tuple(new)))
            continue
        i += 1
    flush()
    return files


def apply(text: str, diff: FileDiff) -> str:
    """Apply one file's hunks to its text; raise PatchApplyError on any mismatch."""
    src = text.splitlines(keepends=True)
    out: list[str] = []
    pos = 0
    for start, old, new in diff.hunks:
        at = start - 1 if old else start
        if at < pos or src[at : at + len(old)] != list(old):
            raise PatchApplyError(f"{diff.path}: hunk at line {start} does not match")
        out.extend(src[pos:at])
        out.extend(new)
        pos = at + len(old)
    out.extend(src[pos:])
    return "".join(out)

"""Matching catalogue signatures against a source tree (a directory on disk or a git commit).

A fix is present in a tree when every one of its signatures matches, in code the interpreter runs
(`scanprog.pattern_matcher` over `scanprog.Code`: comments, docstrings and bare strings never count).
Glob signatures (`**/*.py`) match when any file under the glob carries the string; they are searched in
one pass over the tree.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvgate.catalogue.model import Fix, Presence, Signature
from kvgate.catalogue.scanprog import Code, pattern_matcher


def glob_regex(glob: str) -> re.Pattern[str]:
    """Translate a path glob with `**` (any depth), `*` and `?` (within one component) to a regex."""
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def glob_prefix(glob: str) -> str:
    """The fixed directory part of a glob ('srt/disaggregation/' for 'srt/disaggregation/**/*.py')."""
    parts = glob.split("/")
    fixed = []
    for p in parts[:-1]:
        if any(c in p for c in "*?["):
            break
        fixed.append(p)
    return "/".join(fixed) + ("/" if fixed else "")


@dataclass(frozen=True)
class SignatureHit:
    """One signature's outcome: the files (relative to the package root) where it matched."""

    signature: Signature
    files: tuple[str, ...]
    file_missing: bool = False

    @property
    def matched(self) -> bool:
        return bool(self.files)


@dataclass(frozen=True)
class SignatureResult:
    """All signatures of one fix against one tree."""

    fix_id: str
    hits: tuple[SignatureHit, ...]

    @property
    def presence(self) -> Presence:
        return Presence.PRESENT if self.hits and all(h.matched for h in self.hits) else Presence.ABSENT

    def evidence(self) -> tuple[str, ...]:
        out = []
        for h in self.hits:
            if h.matched:
                where = ", ".join(h.files[:4]) + (f" (+{len(h.files) - 4} more)" if len(h.files) > 4 else "")
                out.append(f"found {h.signature.pattern!r} in {where}")
            elif h.file_missing:
                out.append(f"no file {h.signature.file}")
            else:
                out.append(f"missing {h.signature.pattern!r} in {h.signature.file}")
        return tuple(out)


class SourceTree(ABC):
    """Read access to an sglang package tree, paths relative to the `sglang/` package root."""

    @abstractmethod
    def read_bytes(self, rel: str) -> bytes | None:
        """The file's bytes, or None when it does not exist."""

    def read_text(self, rel: str) -> str | None:
        """The file's text, or None when it does not exist."""
        data = self.read_bytes(rel)
        return None if data is None else data.decode("utf-8", errors="replace")

    @abstractmethod
    def search_globs(self, signatures: Sequence[Signature]) -> dict[Signature, tuple[str, ...]]:
        """For each glob signature, the files under its glob whose text matches it."""

    def scan(self, fixes: Iterable[Fix]) -> dict[str, SignatureResult]:
        """Match every signature of every fix; each file is read at most once."""
        fixes = list(fixes)
        globs = [s for f in fixes for s in f.signatures if s.is_glob]
        glob_hits = self.search_globs(list(dict.fromkeys(globs))) if globs else {}
        cache: dict[str, Code | None] = {}
        results: dict[str, SignatureResult] = {}
        for fix in fixes:
            hits = []
            for sig in fix.signatures:
                if sig.is_glob:
                    hits.append(SignatureHit(sig, glob_hits.get(sig, ())))
                    continue
                if sig.file not in cache:
                    data = self.read_bytes(sig.file)
                    cache[sig.file] = None if data is None else Code(data)
                code = cache[sig.file]
                if code is None:
                    hits.append(SignatureHit(sig, (), file_missing=True))
                    continue
                ok = pattern_matcher(sig.scan_pattern)(code)
                hits.append(SignatureHit(sig, (sig.file,) if ok else ()))
            results[fix.id] = SignatureResult(fix.id, tuple(hits))
        return results


class DirTree(SourceTree):
    """An sglang package directory on disk (the folder holding `srt/`)."""

    def __init__(self, package_dir: Path) -> None:
        self.root = Path(package_dir)

    def read_bytes(self, rel: str) -> bytes | None:
        try:
            return (self.root / rel).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def search_globs(self, signatures: Sequence[Signature]) -> dict[Signature, tuple[str, ...]]:
        found: dict[Signature, list[str]] = {s: [] for s in signatures}
        matchers = [(s, glob_regex(s.file), pattern_matcher(s.scan_pattern)) for s in signatures]
        prefixes = {glob_prefix(s.file) for s in signatures}
        # Walk each distinct top directory once; a prefix inside another walked prefix is skipped.
        tops = sorted(p for p in prefixes if not any(p != q and p.startswith(q) for q in prefixes))
        for top in tops:
            base = self.root / top if top else self.root
            for dirpath, dirnames, filenames in os.walk(base):
                dirnames.sort()
                rel_dir = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
                rel_dir = "" if rel_dir == "." else rel_dir + "/"
                for name in sorted(filenames):
                    rel = rel_dir + name
                    wanted = [(s, m) for s, g, m in matchers if g.match(rel)]
                    if not wanted:
                        continue
                    try:
                        code = Code((self.root / rel).read_bytes())
                    except OSError:
                        continue
                    for s, m in wanted:
                        if m(code):
                            found[s].append(rel)
        return {s: tuple(v) for s, v in found.items()}

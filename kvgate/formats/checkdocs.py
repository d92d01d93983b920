"""Stable check IDs and their pages in docs/checks.md (shipped with the package).

A finding's ID is `gate.check` (what waivers match). docs/checks.md holds one short page per ID or
per family of IDs (`probes.contract.*`), each opened by an HTML anchor; this module only finds the
page of an ID, so the text of every page lives in one place: the document.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass

from kvgate.paths import checks_doc

DOC = "docs/checks.md"
_ENTRY = re.compile(r'^<a id="([^"]+)"></a>\n### `([^`]+)`: (.+)$', re.M)


@dataclass(frozen=True)
class CheckDoc:
    """One page: the anchor, the ID pattern it covers, and its title."""

    anchor: str
    pattern: str
    title: str

    @property
    def ref(self) -> str:
        return f"{DOC}#{self.anchor}"


@functools.lru_cache(maxsize=1)
def entries() -> tuple[CheckDoc, ...]:
    """Every page of docs/checks.md, exact IDs before patterns, longer patterns first."""
    text = checks_doc().read_text(encoding="utf-8")
    docs = [CheckDoc(a, p, t.strip()) for a, p, t in _ENTRY.findall(text)]
    return tuple(sorted(docs, key=lambda d: ("*" in d.pattern, -len(d.pattern))))


def doc_for(check_id: str) -> CheckDoc | None:
    """The page documenting `check_id`, or None when it has none (a test keeps that from shipping)."""
    for d in entries():
        if fnmatch.fnmatchcase(check_id, d.pattern):
            return d
    return None


@functools.cache
def page_text(anchor: str) -> str:
    """The markdown of one page (its heading and body, up to the next page or section), for formats that
    carry the page itself (SARIF rules' help)."""
    text = checks_doc().read_text(encoding="utf-8")
    start = text.find(f'<a id="{anchor}"></a>')
    if start < 0:
        return ""
    body = text[start:].split("\n", 1)[1] if "\n" in text[start:] else ""
    end = min((i for i in (body.find("\n<a id="), body.find("\n## ")) if i >= 0), default=len(body))
    return body[:end].strip()

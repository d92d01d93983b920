"""Redaction of everything kvgate prints, and the secrets (bearer tokens) it redacts, read from the environment.

The rule (docs/security.md, "Secrets"): for every registered secret S, with k = min(FRAGMENT, len(S)),
no output of kvgate contains any k-character substring of S, nor of S as JSON, URL, HTML or repr would
escape it. That covers the whole token, any fragment of 8 or more characters (a prefix left by a cut,
a suffix, a middle), and a token folded across lines by a table: line breaks and the indentation or
table borders around them are looked through (`redact_output`). A run of text covered by such
fragments becomes MASK.

Where the text is made is where it is redacted first: a quoted server body is redacted whole, then
cut (`clip`), so a cut never leaves a prefix too short to recognise. Then the output boundary redacts
again on the final text: the report object before it is rendered, the rendered bytes after, every
stderr line and every progress line.
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Any, TypeVar, cast
from urllib.parse import quote, quote_plus

from kvgate.errors import CUT, UsageError

MASK = "***"
FRAGMENT = 8  # the shortest piece of a secret that is ever recognised (and so never printed)

_SECRETS: set[str] = set()
# k -> every k-character substring of every registered secret (and its escaped forms) with that k.
_GRAMS: dict[int, set[str]] = {}
# A line break in rendered text, with the padding, table borders and colour codes around it: a folded
# token continues after it.
_AROUND = r"(?:\x1b\[[0-9;]*m|[ \t│┃║|])*"
_JOINT = re.compile(_AROUND + r"\r?\n" + _AROUND)

T = TypeVar("T")
_MD_INLINE = re.compile(r"([\\`*_\[\]<>&|~:$])")


def _forms(value: str) -> set[str]:
    """The secret as kvgate's outputs may spell it: as is, JSON-, URL-, HTML-escaped and in a repr, and
    each of those case-folded as kvgate's own transformations fold it (a URL's host is lowercased by
    normalisation; a percent-escape may be written in either case)."""
    escaped = {
        value,
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        quote(value, safe=""),
        quote(value),
        quote_plus(value),
        html.escape(value),
        repr(value)[1:-1],
        _MD_INLINE.sub(r"\\\1", value),  # as sinks.markdown escapes it
        value.replace("%", "%25").replace(":", "%3A").replace(",", "%2C"),  # as a workflow command's property
    }
    return escaped | {f.lower() for f in escaped} | {f.upper() for f in escaped} | {f.casefold() for f in escaped}


def register(value: str) -> None:
    """Remember a secret so that `redact` removes it, and every fragment of it, from any text."""
    if not value or value in _SECRETS:
        return
    _SECRETS.add(value)
    for form in _forms(value):
        k = min(FRAGMENT, len(form))
        _GRAMS.setdefault(k, set()).update(form[i : i + k] for i in range(len(form) - k + 1))


def secrets() -> frozenset[str]:
    """The registered secrets (for tests and the hostile suite)."""
    return frozenset(_SECRETS)


@contextmanager
def scope() -> Iterator[None]:
    """Secrets registered inside are forgotten on leaving (a process that gates several targets; tests)."""
    saved, grams = set(_SECRETS), {k: set(v) for k, v in _GRAMS.items()}
    try:
        yield
    finally:
        _SECRETS.clear()
        _SECRETS.update(saved)
        _GRAMS.clear()
        _GRAMS.update(grams)


def token_from_env(name: str | None, flag: str = "--token-env") -> str | None:
    """Read a bearer token from environment variable `name`; a named but unset variable is a usage error."""
    if not name:
        return None
    value = os.environ.get(name)
    if value is None or not value.strip():
        raise UsageError(f"{flag} {name}: environment variable {name} is not set or empty")
    value = value.strip()
    register(value)
    return value


def _mark(text: str, covered: bytearray, index: list[int] | None = None) -> None:
    """Set covered[i] for every character of `text` inside a k-gram of a secret (index maps to the original)."""
    n = len(text)
    for k, grams in _GRAMS.items():
        if n < k:
            continue
        for i in range(n - k + 1):
            if text[i : i + k] in grams:
                for j in range(i, i + k):
                    covered[index[j] if index is not None else j] = 1


def _mask(text: str, covered: bytearray) -> str:
    if not any(covered):
        return text
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if covered[i]:
            while i < n and covered[i]:
                i += 1
            out.append(MASK)
        else:
            j = i
            while j < n and not covered[j]:
                j += 1
            out.append(text[i:j])
            i = j
    return "".join(out)


def redact(text: str) -> str:
    """`text` with every run covered by a fragment (k-gram) of a registered secret replaced by MASK."""
    if not _GRAMS or not text:
        return text
    covered = bytearray(len(text))
    _mark(text, covered)
    return _mask(text, covered)


def redact_output(text: str) -> str:
    """`redact` on the final text of an output, also looking through line breaks: a token a table
    folded across lines (each piece maybe shorter than FRAGMENT) is masked piece by piece."""
    if not _GRAMS or not text:
        return text
    covered = bytearray(len(text))
    _mark(text, covered)
    if "\n" in text:
        index: list[int] = []
        pieces: list[str] = []
        pos = 0
        for m in [*_JOINT.finditer(text), None]:
            end = m.start() if m is not None else len(text)
            index.extend(range(pos, end))
            pieces.append(text[pos:end])
            pos = m.end() if m is not None else end
        _mark("".join(pieces), covered, index)
    return _mask(text, covered)


def clip(text: str, limit: int) -> str:
    """A quoted body: redacted whole, then cut to `limit` characters (CUT marks the cut).

    The order matters: cut first, and the first characters of a token at the cut would be too few to
    recognise afterwards.
    """
    if not _GRAMS:
        return text if len(text) <= limit else text[:limit] + CUT
    # A fragment is at most FRAGMENT long: whatever covers the first `limit` characters lies in this
    # window, so a 1 MiB body costs what its first `limit + FRAGMENT` characters cost.
    window = text[: limit + FRAGMENT]
    covered = bytearray(len(window))
    _mark(window, covered)
    shown = _mask(window[:limit], covered[:limit])
    return shown if len(text) <= limit else shown + CUT


def redact_obj(obj: T) -> T:
    """A copy of `obj` with every string in it redacted: dataclasses (frozen ones too), mappings,
    lists and tuples, at any depth. Enums and non-string scalars are kept as they are."""
    if not _GRAMS:
        return obj
    return map_strings(obj, redact)


def map_strings(obj: T, fn: Callable[[str], str]) -> T:
    """A copy of `obj` with `fn` applied to every string in it (as `redact_obj` walks it)."""
    return cast(T, _map_any(obj, fn))


def _map_any(obj: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(obj, Enum):
        return obj
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, dict):
        return {_map_any(k, fn): _map_any(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items: Iterable[Any] = (_map_any(v, fn) for v in obj)
        return type(obj)(items) if type(obj) in (list, tuple) else list(items)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: _map_any(getattr(obj, f.name), fn) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    return obj

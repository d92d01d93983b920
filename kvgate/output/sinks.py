"""The output boundary: every byte kvgate emits leaves through here, and server text is data in every sink.

Two duties, in this order of the data's way out:

1. Neutralise server-supplied text for the sink it is bound for, one function per sink (`terminal`,
   `markdown`, `xml`, `workflow_data`/`workflow_property`, `prom_label`). Each shows the text (a
   control character as a visible escape such as `\\x1b`) and never lets it become structure of the
   sink: no terminal control sequence or bidi override, no Markdown/HTML element, no XML-illegal
   character, no workflow command, no second metric line.
2. Redact and write (`write_stream`, `write_file`, `http_body`): the registered secrets and every form
   kvgate derives from them (redact.py) are masked in the final text; a stream bound for a CI job's log
   also gets `defang_step_output`, so no line of it can start with `::` (after the runner trims leading
   whitespace) or carry `##[` (GitHub's older command syntax), whatever a server sent.

tests/output/test_sinks.py proves every sink over arbitrary Unicode with the sink's own parser;
tests/output/test_output_boundary.py lists every write in kvgate/ and fails on one that bypasses this module.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TextIO

from kvgate.output.redact import redact_output
from kvgate.output.safeio import write_output

# Bidi embedding/override/isolate controls and marks (Trojan Source, CVE-2021-42574), plus the line
# and paragraph separators some terminals and editors break lines on.
_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_SEPARATORS = "\u2028\u2029"


def _escape_char(c: str) -> str:
    n = ord(c)
    if n <= 0xFF:
        return f"\\x{n:02x}"
    if n <= 0xFFFF:
        return f"\\u{n:04x}"
    return f"\\U{n:08x}"


def _hidden(c: str) -> bool:
    """A character a sink would act on or cannot carry: C0, DEL, C1, bidi, separators, surrogates,
    noncharacters U+FFFE/U+FFFF (illegal in XML 1.0)."""
    n = ord(c)
    return (
        n < 0x20
        or 0x7F <= n <= 0x9F
        or c in _BIDI
        or c in _SEPARATORS
        or 0xD800 <= n <= 0xDFFF
        or n in (0xFFFE, 0xFFFF)
    )


_HIDDEN_RE = re.compile(
    "[\x00-\x1f\x7f-\x9f" + _BIDI + _SEPARATORS + "\ud800-\udfff\ufffe\uffff]",
)


def visible(text: object) -> str:
    """`text` on one line with every control, bidi, separator, surrogate and noncharacter shown as an escape."""
    s = str(text)
    return _HIDDEN_RE.sub(lambda m: _escape_char(m.group()), s)


def terminal(text: object) -> str:
    """Server text for a terminal or a log line: no C0/C1 controls (ESC included), no bidi overrides."""
    return visible(text)


# What can start inline structure anywhere in a line (GFM, with GitHub's HTML, math and autolinks).
_MD_INLINE = re.compile(r"([\\`*_\[\]<>&|~:$])")
# What can start block structure at the start of a list item or cell: a heading, quote, list, rule.
_MD_LEAD = re.compile(r"^(#{1,6}(?=\s|$)|>|[+\-](?=[\s\-]|$)|\d{1,9}(?=[.)](?:\s|$)))")


def markdown(text: object) -> str:
    """Server text for Markdown (GitHub's step summary, GFM with HTML): one line (controls shown as
    escapes), every character that could open inline structure backslash-escaped (so `<KVG...>` shows
    as text and a `|` stays in its cell), and nothing at its start read as a block (heading, list, quote,
    indented code: leading spaces become no-break spaces)."""
    s = _MD_INLINE.sub(r"\\\1", visible(text))
    body = s.lstrip(" ")
    s = "\u00a0" * (len(s) - len(body)) + body
    m = _MD_LEAD.match(body)
    if m is None:
        return s
    lead = len(s) - len(body)
    if m.group(1)[0].isdigit():  # "1." / "1)": escape the delimiter after the digits
        end = lead + len(m.group(1))
        return s[:end] + "\\" + s[end:]
    return s[:lead] + "\\" + s[lead:]


def code_span(text: object) -> str:
    """Text for inside a Markdown code span (`...`): one line, no backtick to close it early."""
    return visible(text).replace("`", "'")


def xml(text: object) -> str:
    """Server text for XML 1.0 (JUnit): only characters XML 1.0 allows, controls as visible escapes.
    (ElementTree escapes `<`, `&` and quotes itself.)"""
    return visible(text)


def _wf_escape(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def workflow_data(text: object) -> str:
    """The message of a GitHub workflow command (`::error ...::MESSAGE`), as the runner unescapes it
    (`%`, CR, LF), with `##[` broken so the runner's older parser cannot see a command in it."""
    return _defang_v1(_wf_escape(str(text)))


def workflow_property(text: object) -> str:
    """A property value of a workflow command (`title=VALUE`): also `:` and `,` escaped."""
    return _defang_v1(_wf_escape(str(text)).replace(":", "%3A").replace(",", "%2C"))


def prom_label(text: object) -> str:
    """A Prometheus label value: one line, no control characters (prometheus_client escapes `\\`, `"`)."""
    return visible(text)


# -- step output: what the GitHub runner parses as commands --------------------------------------

ZWSP = "\u200b"  # not whitespace to the runner (.NET char.IsWhiteSpace), invisible to people
# The runner reads a step's output line by line (CR, LF or CRLF end a line) and trims leading
# whitespace (.NET's char.IsWhiteSpace) before looking for "::".
_LINE_BREAK = re.compile(r"(\r\n|\r|\n)")
_NET_SPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + "\u2028\u2029\u202f\u205f\u3000"
)


def _defang_v1(text: str) -> str:
    return text.replace("##[", "#" + ZWSP + "#[")


def defang_step_output(text: str) -> str:
    """Text bound for a CI job's log: no line that starts with `::` once leading whitespace is trimmed,
    no `##[` anywhere. A ZWSP between the two characters keeps the text as people read it."""
    parts = _LINE_BREAK.split(text)
    for i in range(0, len(parts), 2):
        line = parts[i]
        body = line.lstrip(_NET_SPACE)
        if body.startswith("::"):
            lead = line[: len(line) - len(body)]
            line = lead + ":" + ZWSP + body[1:]
        parts[i] = _defang_v1(line)
    return "".join(parts)


# -- the boundary: redaction and the write itself ---------------------------------------------


def write_stream(stream: TextIO, text: str) -> None:
    """Write to stdout/stderr (or any text stream a person or a CI log reads): redacted, defanged."""
    stream.write(defang_step_output(redact_output(text)))


def echo(text: str, err: bool = False, *, indent_lines: bool = False) -> None:
    """One message line to stdout or stderr: neutralised for the terminal (a line break in it is shown
    as `\\x0a`, never a second line), then `write_stream`. With `indent_lines` an error that carries a
    log tail keeps its lines, each one neutralised and indented under the first (never a line of its own)."""
    import sys

    stream = sys.stderr if err else sys.stdout
    if indent_lines:
        first, *rest = text.split("\n")
        write_stream(stream, "".join([terminal(first) + "\n", *("  " + terminal(line) + "\n" for line in rest)]))
    else:
        write_stream(stream, terminal(text) + "\n")
    stream.flush()


def write_file(path: Path, text: str) -> None:
    """Write an output file (a report, a baseline), redacted: a regular file atomically, a path that
    exists and is not a regular file (a FIFO, a terminal, `/dev/stdout`) in place (`safeio.write_output`)."""
    write_output(path, redact_output(text))


def http_body(text: str) -> bytes:
    """A body the watch endpoint serves (/metrics, /verdict, /healthz): redacted, UTF-8."""
    return redact_output(text).encode("utf-8", "backslashreplace")


class BoundaryStream:
    """A text stream (for Rich's Console, the progress lines) whose every write goes through `write_stream`.

    Each write is taken as a whole: callers write whole lines or whole rendered frames.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        write_stream(self._stream, text)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)

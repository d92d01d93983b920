"""The code scan that runs where sglang is installed: standard library only, sent as a program on stdin.

`kvgate fixes/check --python CMD` runs CMD (an interpreter, or a wrapper such as `kubectl exec -i POD --
python3`) with `program_text(request)` on its standard input; the program prints one JSON document and
needs nothing of kvgate on that machine. `--site-packages PATH` runs the same `scan()` in-process, so
both read a tree the same way. This module must import nothing outside the standard library and must
run on any Python 3.6+: it is the program text itself.

The request names files (relative to the `sglang/` package) and patterns; the answer gives, per file,
its sha256 and which patterns it carries, per glob the matching files, per kvgate backport id the files
carrying its marker line, and the declared version. Nothing is imported from sglang: the package is
located with importlib's finder only.

A pattern counts only in code the interpreter runs (`Code`): the file is read as Python tokens (its
comments and string literals found in one pass), so a fix commented out, or quoted in a docstring or
in a statement that is only a string, reads as absent. Its kind says where it must stand: "sub:" a
substring and "re:" a MULTILINE regex outside any string literal (a call, a definition); "ssub:" and
"sre:" inside a string literal the code uses (a message the fixed code raises or logs, a key it reads);
"asub:" in either (a backport's code lines, some of them messages: its file hashes say the rest); "txt:"
the raw bytes (kvgate's own marker comment). Only a file whose raw bytes match is lexed, so the scan
keeps a grep's speed.
"""

import bisect
import hashlib
import importlib.util
import json
import os
import re
import sys

SCAN_SCHEMA = 2
VERSION_RX = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.MULTILINE)
# The label line every kvgate backport patch adds to each file it changes: MARKER_PREFIX + patch id.
# Its one home (this module is sent as a program, so it cannot import it from anywhere else).
MARKER_PREFIX = "# kvgate-backport: "
_MARKER_BYTES = MARKER_PREFIX.encode("ascii")
_MARKER_RX = re.compile(rb"^[ \t]*" + re.escape(_MARKER_BYTES) + rb"([A-Za-z0-9_.-]+)[ \t]*\r?$", re.MULTILINE)
_MAX_LIST = 64  # files listed per glob or marker id; the answer stays small whatever the tree


def _is_package_dir(path):
    return os.path.isdir(os.path.join(path, "srt")) and (
        os.path.isfile(os.path.join(path, "__init__.py")) or os.path.isfile(os.path.join(path, "_version.py"))
    )


def find_package(root=None):
    """(package dir, how it was found): `root` (a site-packages folder or the package), else find_spec."""
    if root is not None:
        for cand in (os.path.join(root, "sglang"), root):
            if _is_package_dir(cand):
                return os.path.realpath(cand), "path " + root
        return None, "no sglang package under " + root
    spec = importlib.util.find_spec("sglang")
    for loc in list(spec.submodule_search_locations or []) if spec else []:
        if _is_package_dir(loc):
            return os.path.realpath(loc), "importlib.util.find_spec('sglang') in " + sys.executable
    return None, "sglang is not importable by " + sys.executable


def declared_version(package_dir):
    """`__version__` from _version.py or version.py, else the dist-info next to the package."""
    for name in ("_version.py", "version.py"):
        try:
            with open(os.path.join(package_dir, name), encoding="utf-8", errors="replace") as fh:
                m = VERSION_RX.search(fh.read())
        except OSError:
            continue
        if m:
            return m.group(1), name
    parent = os.path.dirname(package_dir)
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        names = []
    for name in names:
        if name.startswith("sglang-") and name.endswith(".dist-info"):
            try:
                with open(os.path.join(parent, name, "METADATA"), encoding="utf-8", errors="replace") as fh:
                    for line in fh:
                        if line.startswith("Version:"):
                            return line.split(":", 1)[1].strip(), name + "/METADATA"
            except OSError:
                continue
    return None, None


# Python's comments and string literals, found left to right: at each '#' or quote not already inside
# one, the token it opens (any prefix, single or triple quoted, escapes and escaped line ends included).
_START_RX = re.compile(rb"[#'\"]")
_END_RX = {
    b"'''": re.compile(rb"[^\\']*(?:(?:\\.|'(?!''))[^\\']*)*'''", re.DOTALL),
    b'"""': re.compile(rb'[^\\"]*(?:(?:\\.|"(?!""))[^\\"]*)*"""', re.DOTALL),
    b"'": re.compile(rb"[^\\\n']*(?:\\.[^\\\n']*)*'", re.DOTALL),
    b'"': re.compile(rb'[^\\\n"]*(?:\\.[^\\\n"]*)*"', re.DOTALL),
}
_PREFIX = frozenset(b"rRbBuUfF")
_WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def lex(text):
    """(starts, ends) of every comment and string literal of `text` (bytes, line ends as LF)."""
    starts, ends = [], []  # type: list[int], list[int]
    m = _START_RX.search(text)
    while m:
        at = quote_at = m.start()
        if text[at] == 35:  # '#': a comment to the end of its line
            end = text.find(b"\n", at)
            end = len(text) if end < 0 else end
        else:
            quote = text[at : at + 3] if text[at : at + 3] in (b"'''", b'"""') else text[at : at + 1]
            body = _END_RX[quote].match(text, at + len(quote))
            end = body.end() if body else len(text)  # unterminated: the rest is not code either
            while at > 0 and at > quote_at - 3 and text[at - 1] in _PREFIX:
                at -= 1  # the prefix letters (r, b, u, f) belong to the literal
            if at < quote_at and at > 0 and text[at - 1] in _WORD:
                at = quote_at  # letters of a name, not a prefix
        starts.append(at)
        ends.append(end)
        m = _START_RX.search(text, end)
    return starts, ends


CODE_KINDS = ("sub", "re")  # outside string literals
STRING_KINDS = ("ssub", "sre")  # inside a string literal the code uses
ANY_KINDS = ("asub",)  # anywhere in the code, string literals included
TEXT_KINDS = ("txt",)  # the raw bytes (kvgate's own marker comment only)
_OPEN, _CLOSE = (b"(", b"[", b"{"), (b")", b"]", b"}")


class Code:
    """One file's bytes and, lexed once when first asked for, where its comments and strings are."""

    __slots__ = ("data", "text", "_tokens")

    def __init__(self, data):
        self.data = data
        self.text = b""
        self._tokens = None

    def tokens(self):
        """(starts, ends) of every comment and string literal of `text` (the bytes, line ends as LF)."""
        if self._tokens is None:
            text = self.data
            if b"\r" in text:
                text = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            self.text = text
            self._tokens = lex(text)
        return self._tokens

    def where(self, a, b):
        """Where the span [a, b) of `text` stands: "comment" (it touches a comment), "dead" (it touches a
        string that is a whole statement: a docstring, a bare string), "string" (inside one string
        literal the code uses) or "code"."""
        starts, ends = self.tokens()
        text = self.text
        i = bisect.bisect_right(starts, a) - 1
        if i < 0 or ends[i] <= a:
            i += 1  # the first token that could overlap
        inside = False
        while i < len(starts) and starts[i] < b:
            if text[starts[i] : starts[i] + 1] == b"#":
                return "comment"
            if self._dead(i):
                return "dead"
            if starts[i] <= a and b <= ends[i]:
                inside = True
            i += 1
        return "string" if inside else "code"

    def _is_comment(self, i):
        starts = self.tokens()[0]
        return self.text[starts[i] : starts[i] + 1] == b"#"

    def _dead(self, k):
        """Whether string token k (with the strings beside it) is a whole statement: it starts a logical
        line (outside brackets, not after a line continuation) and only a comment or `;` follows it."""
        starts, ends = self.tokens()
        text = self.text
        first = k
        while first > 0 and not self._is_comment(first - 1) and not text[ends[first - 1] : starts[first]].strip():
            first -= 1  # implicitly concatenated with the string before it (only blanks between)
        last = k
        while (
            last + 1 < len(starts)
            and not self._is_comment(last + 1)
            and not text[ends[last] : starts[last + 1]].strip()
        ):
            last += 1
        line_start = text.rfind(b"\n", 0, starts[first]) + 1
        if text[line_start : starts[first]].strip(b" \t\f"):
            return False  # something stands before it on its line
        if line_start >= 2 and text[line_start - 2 : line_start - 1] == b"\\":
            return False  # a continued line
        line_end = text.find(b"\n", ends[last])
        rest = text[ends[last] : len(text) if line_end < 0 else line_end].strip(b" \t\f")
        if rest and not rest.startswith((b"#", b";")):
            return False  # an expression goes on: a method call, an operator
        depth, prev = 0, 0
        for i in range(first + 1):  # brackets open in code before it: it is inside an expression
            gap = text[prev : starts[i]]
            depth += sum(gap.count(c) for c in _OPEN) - sum(gap.count(c) for c in _CLOSE)
            prev = ends[i]
        return depth <= 0


def pattern_matcher(pattern):
    """A predicate on a `Code` for one pattern string ('KIND:BODY', the kinds in the module's doc)."""
    kind, _, body = pattern.partition(":")
    if kind in ("sub", "ssub", "asub", "txt"):
        needle = body.encode("utf-8")

        def raw(data):
            return needle in data

        def spans(text):
            at = text.find(needle)
            while at >= 0:
                yield at, at + len(needle)
                at = text.find(needle, at + 1)

    elif kind in ("re", "sre"):
        rx = re.compile(body.encode("utf-8"), re.MULTILINE)

        def raw(data):
            return rx.search(data) is not None

        def spans(text):
            for m in rx.finditer(text):
                yield m.start(), m.end()

    else:
        raise ValueError("unknown pattern kind: " + pattern)
    if kind in TEXT_KINDS:
        return lambda code: raw(code.data)
    wanted = ("code",) if kind in CODE_KINDS else ("string",) if kind in STRING_KINDS else ("code", "string")

    def match(code):
        if not raw(code.data):
            return False  # the raw bytes first: most files are never lexed
        code.tokens()
        for a, b in spans(code.text):
            if code.where(a, b) in wanted:
                return True
        return False

    return match


def file_facts(data, patterns):
    """sha256, pattern hits and marker ids of one file's bytes (None = no such file)."""
    if data is None:
        return None
    code = Code(data)
    return {
        "sha256": hashlib.sha256(data).hexdigest(),
        "hits": {p: bool(pattern_matcher(p)(code)) for p in patterns},
        "markers": markers_in(data),
    }


def markers_in(data):
    """The kvgate backport ids whose marker line the bytes carry."""
    return sorted(set(m.decode("ascii") for m in _MARKER_RX.findall(data)))


def _read(package_dir, rel):
    try:
        with open(os.path.join(package_dir, *rel.split("/")), "rb") as fh:
            return fh.read()
    except (OSError, ValueError):
        return None


def scan(request, root=None):
    """The answer to `request` for the sglang package under `root` (None: the one this Python imports)."""
    package_dir, found_by = find_package(root)
    out = {
        "kvgate_scan": SCAN_SCHEMA,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "package_dir": package_dir,
        "found_by": found_by,
    }
    if package_dir is None:
        out["error"] = found_by
        return out
    out["version"], out["version_file"] = declared_version(package_dir)
    out["files"] = {rel: file_facts(_read(package_dir, rel), pats) for rel, pats in sorted(request["files"].items())}
    globs = [(g["id"], re.compile(g["path_regex"]), pattern_matcher(g["pattern"])) for g in request.get("globs", [])]
    found = {gid: [] for gid, _, _ in globs}  # type: dict[str, list[str]]
    markers = {}  # type: dict[str, list[str]]
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        rel_dir = os.path.relpath(dirpath, package_dir).replace(os.sep, "/")
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        for name in sorted(filenames):
            rel = rel_dir + name
            wanted = [(gid, match) for gid, path_rx, match in globs if path_rx.match(rel)] if globs else ()
            if not wanted and not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(dirpath, name), "rb") as fh:
                    data = fh.read()
            except (OSError, ValueError):
                continue
            if wanted:
                code = Code(data)
                for gid, match in wanted:
                    if len(found[gid]) < _MAX_LIST and match(code):
                        found[gid].append(rel)
            if name.endswith(".py") and _MARKER_BYTES in data:
                for pid in markers_in(data):
                    files = markers.setdefault(pid, [])
                    if len(files) < _MAX_LIST:
                        files.append(rel)
    out["globs"] = found
    out["markers"] = markers
    return out


def emit(request_json):
    """Entry point of the stdin program: scan and print one JSON document on one line."""
    sys.stdout.write(json.dumps(scan(json.loads(request_json)), sort_keys=True) + "\n")
    sys.stdout.flush()


def locate():
    """Entry point of the locate program: where this interpreter's sglang is, one JSON line, no scan."""
    package_dir, found_by = find_package()
    out = {"kvgate_scan": SCAN_SCHEMA, "package_dir": package_dir, "found_by": found_by}
    if package_dir is None:
        out["error"] = found_by
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    sys.stdout.flush()


def _source():
    with open(__file__, encoding="utf-8") as fh:
        return fh.read()


def program_text(request):
    """This module's source plus the call that answers `request`: what `--python CMD` gets on stdin."""
    return _source() + "\nemit(" + repr(json.dumps(request, sort_keys=True)) + ")\n"


def locate_text():
    """This module's source plus the call that only locates the package (`kvgate backport --python`)."""
    return _source() + "\nlocate()\n"

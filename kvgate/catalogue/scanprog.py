"""The code scan that runs where sglang is installed: standard library only, sent as a program on stdin.

`kvgate fixes/check --python CMD` runs CMD (an interpreter, or a wrapper such as `kubectl exec -i POD --
python3`) with `program_text(request)` on its standard input; the program prints one JSON document and
needs nothing of kvgate on that machine. `--site-packages PATH` runs the same `scan()` in-process, so
both read a tree the same way. This module must import nothing outside the standard library and must
run on any Python 3.6+: it is the program text itself.

The request names files (relative to the `sglang/` package) and patterns ("sub:" a substring, "re:" a
MULTILINE regex); the answer gives, per file, its sha256 and which patterns it carries, per glob the
matching files, per kvgate backport id the files carrying its marker line, and the declared version.
Nothing is imported from sglang: the package is located with importlib's finder only.
"""

import hashlib
import importlib.util
import json
import os
import re
import sys

SCAN_SCHEMA = 1
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


def pattern_matcher(pattern):
    """A bytes predicate for one pattern string ('sub:TEXT' or 're:REGEX')."""
    kind, _, body = pattern.partition(":")
    if kind == "sub":
        needle = body.encode("utf-8")
        return lambda data: needle in data
    if kind == "re":
        rx = re.compile(body.encode("utf-8"), re.MULTILINE)
        return lambda data: rx.search(data) is not None
    raise ValueError("unknown pattern kind: " + pattern)


def file_facts(data, patterns):
    """sha256, pattern hits and marker ids of one file's bytes (None = no such file)."""
    if data is None:
        return None
    return {
        "sha256": hashlib.sha256(data).hexdigest(),
        "hits": {p: bool(pattern_matcher(p)(data)) for p in patterns},
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
            wanted = [(gid, match) for gid, path_rx, match in globs if path_rx.match(rel)]
            if not wanted and not name.endswith(".py"):
                continue
            data = _read(package_dir, rel)
            if data is None:
                continue
            for gid, match in wanted:
                if match(data) and len(found[gid]) < _MAX_LIST:
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

# -*- coding: utf-8 -*-
# The launcher of dist/kvgate (tools/build_binary.py copies it into the zipapp as __main__.py).
#
# Kept in the oldest syntax on purpose: any python3 (or python2) that opens the file must get
# as far as the version check and exit 5 with a message, never a SyntaxError traceback (exit 1,
# which a pipeline reads as "gate failed"). No f-strings, no annotations, no walrus.
import os
import sys

BUILD_ID = "@BUILD_ID@"  # replaced at build time: the sha256 of the bundled files
SITE = "site/"  # the folder inside the zip holding kvgate and its pure-Python dependencies
MIN_PYTHON = (3, 10)
INTERNAL_ERROR = 5


def _fail(message):
    sys.stderr.write("kvgate: error: %s (exit %d)\n" % (message, INTERNAL_ERROR))
    sys.stderr.flush()
    sys.exit(INTERNAL_ERROR)


def _roots():
    """Where the file may unpack itself, first choice first."""
    explicit = os.environ.get("KVGATE_BIN_ROOT")
    if explicit:
        return [explicit]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    import tempfile

    uid = getattr(os, "getuid", lambda: 0)()
    return [os.path.join(cache, "kvgate-bin"), os.path.join(tempfile.gettempdir(), "kvgate-bin-%d" % uid)]


def _unpack(archive, target):
    """Extract the bundled site into `target` whole: into a sibling folder, then one rename."""
    import shutil
    import tempfile
    import zipfile

    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        os.makedirs(parent)
    partial = tempfile.mkdtemp(prefix=".unpack-", dir=parent)
    try:
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                if not name.startswith(SITE) or name.endswith("/"):
                    continue
                rel = name[len(SITE) :]
                if rel.startswith("/") or ".." in rel.split("/"):
                    raise ValueError("unsafe member %r in %s" % (name, archive))
                dest = os.path.join(partial, rel)
                if not os.path.isdir(os.path.dirname(dest)):
                    os.makedirs(os.path.dirname(dest))
                with zf.open(name) as src, open(dest, "wb") as out:
                    shutil.copyfileobj(src, out)
        try:
            os.rename(partial, target)
        except OSError:
            if not os.path.isdir(target):  # another run unpacked it first: theirs is as good
                raise
    finally:
        if os.path.isdir(partial):
            shutil.rmtree(partial, ignore_errors=True)


def _site(archive):
    """The unpacked site folder of this build, unpacking it on first use."""
    problems = []
    for root in _roots():
        target = os.path.join(root, "kvgate-" + BUILD_ID[:16])
        if os.path.isdir(target):
            return target
        try:
            _unpack(archive, target)
            return target
        except Exception as exc:  # an unwritable root: try the next one
            problems.append("%s: %s" % (root, exc))
    _fail("could not unpack %s (%s); set KVGATE_BIN_ROOT to a writable folder" % (archive, "; ".join(problems)))


def main():
    if sys.version_info[:2] < MIN_PYTHON:
        _fail(
            "this kvgate file needs CPython >= %d.%d (built and tested for 3.10-3.13); %s is Python %s"
            % (MIN_PYTHON + (sys.executable or "python", sys.version.split()[0]))
        )
    archive = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, _site(archive))
    # kvgate.extras reads it: what needs processes of its own (the simulator) is refused, not half-started
    os.environ["KVGATE_SINGLE_FILE"] = archive
    try:
        from kvgate.cli import main as kvgate_main
    except Exception as exc:
        _fail("kvgate could not start on Python %s: %s: %s" % (sys.version.split()[0], type(exc).__name__, exc))
    try:
        kvgate_main()
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as exc:  # the commands report their own crashes; this is what escaped them
        _fail("kvgate crashed on Python %s: %s: %s" % (sys.version.split()[0], type(exc).__name__, exc))


main()

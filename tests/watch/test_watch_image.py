"""examples/kubernetes/watch/Dockerfile builds an image that can run `watch`: without Docker, the test
builds what the Dockerfile copies (the wheel, by the command its header gives), checks every COPY source
exists, that the wheel's `watch` extra brings prometheus_client, and runs the image's entrypoint
(`kvgate`, the wheel's own console script, importing kvgate from the wheel) with `watch --help`."""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WATCH = ROOT / "examples" / "kubernetes" / "watch"
DOCKERFILE = WATCH / "Dockerfile"
pytestmark = pytest.mark.slow


def _instructions() -> list[tuple[str, str]]:
    return [
        (ln.split(" ", 1)[0], ln.split(" ", 1)[1])
        for ln in DOCKERFILE.read_text().splitlines()
        if ln and not ln.startswith("#")
    ]


def test_the_watch_image_runs_watch(tmp_path: Path) -> None:
    header = DOCKERFILE.read_text()
    build = re.search(r"#\s+(python3 -m pip wheel [^&\n]+)", header)
    assert build, "the Dockerfile's header says how to build what it copies"
    argv = shlex.split(build.group(1))
    assert argv[:4] == ["python3", "-m", "pip", "wheel"] and argv[-1] == "."
    ctx = tmp_path / "ctx"  # the build context: the repository's examples plus the built dist/
    ctx.mkdir()
    (ctx / "examples").symlink_to(ROOT / "examples")
    dist = ctx / "dist"
    out = argv[argv.index("-w") + 1]
    assert out == "dist"
    proc = subprocess.run(
        [sys.executable, *argv[1:-1], "-q", "-w", str(dist), str(ROOT)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = _instructions()
    assert steps[0][0] == "FROM"
    for op, arg in steps:
        if op == "COPY":
            *srcs, _dest = arg.split()
            for src in srcs:
                assert glob.glob(str(ctx / src)), f"COPY {src}: nothing in the build context"
    (run,) = [a for op, a in steps if op == "RUN"]
    assert "[watch]" in run and "kvgate watch --help" in run
    (whl,) = dist.glob("kvgate-*.whl")
    with zipfile.ZipFile(whl) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert "Provides-Extra: watch" in meta
    assert re.search(r"^Requires-Dist: prometheus[-_]client.*extra == .watch.", meta, re.M | re.I), meta
    # The entrypoint: the wheel's console script, importing kvgate from the wheel only (its dependencies,
    # the watch extra included, from this interpreter's environment).
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(whl)]
    assert subprocess.run(pip, capture_output=True, timeout=300).returncode == 0
    (entry,) = [a for op, a in steps if op == "ENTRYPOINT"]
    exe = yaml.safe_load(entry)[0]
    script = site / "bin" / exe
    assert script.is_file()
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = "import kvgate, sys; print(kvgate.__file__)"
    where = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path
    )
    assert where.stdout.strip().startswith(str(site)), where.stdout
    res = subprocess.run(
        [sys.executable, str(script), "watch", "--help"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr
    assert "--router-url" in res.stdout

"""Issue 40, class 6, rebuilt: an output path that is not a file.

`-o /dev/stdout` was written as temp-then-rename: the link was replaced by a regular file (as root in
a CI container, the system's `/dev/stdout`) and nothing reached stdout. Now `-` is stdout, and a path
that exists and is not a regular file (a character device, a FIFO, a symlink to one, a descriptor of
this process) is written in place, never replaced. The real `/dev/stdout` is never touched here: each
case uses a FIFO, a pty or a link to this process's descriptor, made in the test's own folder.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.output import safeio

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
FIXES = ["fixes", "--quiet", "--release", "0.5.20", "-f", "json"]  # exit 1: 0.5.20 lacks fixes


class Reader(threading.Thread):
    """Reads a FIFO or a pty master to its end, as another process would."""

    def __init__(self, path: Path | None = None, fd: int | None = None) -> None:
        super().__init__(daemon=True)
        self.path, self.fd, self.data = path, fd, b""

    def run(self) -> None:
        fd = os.open(self.path, os.O_RDONLY) if self.path is not None else self.fd
        assert fd is not None
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # a pty master reads EIO once its slave is closed
                break
            if not chunk:
                break
            self.data += chunk
        if self.path is not None:
            os.close(fd)


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(".kvgate-tmp")]


def test_dash_is_stdout_and_no_file_named_dash_appears(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, [*FIXES, "-o", "-"])
    assert res.exit_code == 1, res.output
    assert json.loads(res.stdout)["command"].startswith("fixes")  # only the JSON: no table beside it
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("through_link", [False, True], ids=["fifo", "link-to-fifo"])
def test_a_fifo_is_written_in_place(tmp_path: Path, through_link: bool) -> None:
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    dest = fifo
    if through_link:
        dest = tmp_path / "report.json"
        dest.symlink_to(fifo)
    reader = Reader(fifo)
    reader.start()
    res = runner.invoke(app, [*FIXES, "-o", str(dest)])
    reader.join(timeout=30)
    assert res.exit_code == 1, res.output
    assert json.loads(reader.data)["command"].startswith("fixes")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert dest.is_symlink() == through_link
    assert _leftovers(tmp_path) == []


def test_a_fifo_with_no_reader_is_a_bounded_error_not_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(safeio, "FIFO_READER_WAIT_S", 0.3)
    fifo = tmp_path / "nobody.fifo"
    os.mkfifo(fifo)
    res = runner.invoke(app, [*FIXES, "-o", str(fifo)])
    assert res.exit_code == 1  # the verdict is the gate's; the unwritten report is said on stderr
    assert "could not write json report" in res.stderr and "no reader" in res.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and _leftovers(tmp_path) == []


def test_a_terminal_is_written_in_place_through_a_link(tmp_path: Path) -> None:
    master, slave = os.openpty()
    link = tmp_path / "report.json"
    link.symlink_to(os.ttyname(slave))
    reader = Reader(fd=master)
    reader.start()
    try:
        res = runner.invoke(app, [*FIXES, "-o", str(link)])
        assert link.is_symlink() and stat.S_ISCHR(os.stat(link).st_mode)
    finally:
        os.close(slave)
        reader.join(timeout=30)
        os.close(master)
    assert res.exit_code == 1, res.output
    assert json.loads(reader.data.replace(b"\r\n", b"\n"))["command"].startswith("fixes")


@pytest.mark.parametrize("dest", ["link", "/dev/fd/1"])
def test_this_process_stdout_by_path_is_stdout(tmp_path: Path, dest: str) -> None:
    """`-o /dev/stdout` as CI writes it, with stdout a regular file the shell opened: the report is
    appended to stdout (never a new file over the link, never written at offset 0 over the table)."""
    link = tmp_path / "stdout-link"
    link.symlink_to("/proc/self/fd/1")
    target = str(link) if dest == "link" else dest
    out = tmp_path / "captured.txt"
    with out.open("wb") as fh:
        proc = subprocess.run(
            [sys.executable, "-c", "from kvgate.cli import main; main()", *FIXES, "-f", "table", "-o", target],
            stdout=fh,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            timeout=120,
            env={**os.environ, "COLUMNS": "120"},
        )
    assert proc.returncode == 1, proc.stderr
    text = out.read_text()
    start = text.index("{")
    doc, end = json.JSONDecoder().raw_decode(text, start)
    assert doc["command"].startswith("fixes")
    assert "GATE FAILED" in text[end:]  # the table, after the JSON on the same stream
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a link owned by another user needs root")
def test_a_link_another_user_planted_is_replaced_not_followed(tmp_path: Path) -> None:
    fifo = tmp_path / "theirs.fifo"
    os.mkfifo(fifo)
    link = tmp_path / "report.json"
    link.symlink_to(fifo)
    os.lchown(link, 54321, 54321)  # not root, not us, not the folder's owner
    res = runner.invoke(app, [*FIXES, "-o", str(link)])
    assert res.exit_code == 1, res.output
    assert not link.is_symlink() and json.loads(link.read_text())["command"].startswith("fixes")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_directory_is_refused_by_name(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    res = runner.invoke(app, [*FIXES, "-o", str(folder)])
    assert "cannot write the json report" in res.stderr and "it is a folder" in res.stderr and str(folder) in res.stderr
    assert folder.is_dir() and list(folder.iterdir()) == []


def test_a_baseline_is_never_written_to_stdout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """stdout carries the report: `--write-baseline -` is a usage error naming it, and no file `-` appears."""
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["check", "--prefill-url", "http://127.0.0.1:9", "--write-baseline", "-", "-f", "json"])
    assert res.exit_code == 2, res.output
    assert "--write-baseline -" in json.dumps(json.loads(res.stdout)) and list(tmp_path.iterdir()) == []

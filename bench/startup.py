"""Start-up cost of `kvgate --help` as a ratio of a two-command hello-world Typer app's `--help` (goal <= 1.3).

Both run side by side in this one process, interleaved, with the same interpreter; the CPU time
(user + system) of each child comes from the kernel (os.wait4), so other load on the machine moves
wall time but barely moves it. With `--binary dist/kvgate` the single-file build is measured too
(its first run unpacks the zipapp and is not counted; a warm-up run precedes the samples).

    .venv/bin/python bench/startup.py [--runs 15] [--binary dist/kvgate] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

GOAL = 1.3
ROOT = Path(__file__).resolve().parent.parent

HELLO = '''
import typer

app = typer.Typer()


@app.command()
def hello(name: str = "world") -> None:
    """Say hello."""
    print(f"hello {name}")


@app.command()
def bye(name: str = "world") -> None:
    """Say bye."""
    print(f"bye {name}")


app()
'''


def cpu_seconds(argv: list[str], env: dict[str, str]) -> float:
    """User + system CPU seconds of one child run; it must exit 0."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.read().decode()[-500:]}")  # type: ignore[union-attr]
    return usage.ru_utime + usage.ru_stime


def measure(runs: int, binary: str | None) -> dict[str, object]:
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", str(ROOT))
    env["PYTHONDONTWRITEBYTECODE"] = "0"
    with tempfile.TemporaryDirectory() as tmp:
        hello = Path(tmp) / "hello.py"
        hello.write_text(HELLO)
        cmds = {
            "hello-world typer --help": [sys.executable, str(hello), "--help"],
            "kvgate --help": [sys.executable, "-c", "from kvgate.cli import main; main()", "--help"],
        }
        if binary:
            cmds["dist/kvgate --help"] = [binary, "--help"]
        samples: dict[str, list[float]] = {k: [] for k in cmds}
        for argv in cmds.values():  # warm-up: byte-compile, page cache, unpack the zipapp
            cpu_seconds(argv, env)
        for _ in range(runs):
            for name, argv in cmds.items():
                samples[name].append(cpu_seconds(argv, env))
    med = {k: statistics.median(v) for k, v in samples.items()}
    base = med["hello-world typer --help"]
    return {
        "runs": runs,
        "median_cpu_s": {k: round(v, 4) for k, v in med.items()},
        "ratio": {k: round(v / base, 3) for k, v in med.items() if k != "hello-world typer --help"},
        "goal": GOAL,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--binary", default=None, help="also measure this single-file build")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = measure(args.runs, args.binary)
    if args.json:
        print(json.dumps(result))
        return
    for name, secs in result["median_cpu_s"].items():  # type: ignore[union-attr]
        print(f"{name:28s} {secs * 1000:7.1f} ms CPU (median of {args.runs})")
    for name, ratio in result["ratio"].items():  # type: ignore[union-attr]
        verdict = "meets" if ratio <= GOAL else "MISSES"
        print(f"{name:28s} {ratio:.2f}x the hello-world app ({verdict} the {GOAL}x goal)")


if __name__ == "__main__":
    main()

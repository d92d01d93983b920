"""Running `kvgate soak` in-process against a simulated deployment, and reading what it wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from kvgate.cli import app

#: a short soak for tests: seconds, not minutes (every other setting at the profile's defaults)
SHORT = ["--duration", "8", "--slice", "2", "--ramp", "1"]


def soak(router: str, tmp: Path, *extra: str) -> tuple[int, dict[str, Any], Path, str]:
    """Run one soak; the exit code, the json report, the html report's path and the output."""
    js, page = tmp / "soak.json", tmp / "soak.html"
    args = ["soak", "--router-url", router, *SHORT, *extra, "-f", "json", "-o", str(js), "-f", "html", "-o", str(page)]
    res = CliRunner().invoke(app, args)
    assert js.is_file(), res.output  # the report is written in every case
    return res.exit_code, json.loads(js.read_text()), page, res.output


def slices(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = doc["cost"]["soak"]["slices"]
    return out

"""JSON report with a schema version, for machines."""

from __future__ import annotations

import json
from pathlib import Path

from kvgate import __version__
from kvgate.formats.base import Formatter
from kvgate.formats.digest import doc_ref
from kvgate.results.findings import Report

SCHEMA_VERSION = 1
SCHEMA_FILE = Path(__file__).with_name("report.schema.json")


def schema_text() -> str:
    """The published JSON Schema of this report (`kvgate schema` prints it)."""
    return SCHEMA_FILE.read_text(encoding="utf-8")


class JsonFormatter(Formatter):
    def render(self, report: Report) -> str:
        doc = {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "kvgate", "version": __version__},
            "command": report.command,
            "started_at": report.started_at,
            "finished_at": report.finished_at,
            "strict": report.strict,
            "strict_source": report.strict_source,
            "exit_status": int(report.exit_status),
            "verdict": report.exit_status.name.lower(),
            "counts": report.counts(),
            "target": report.target,
            "cost": report.cost,
            "notes": list(report.notes),
            "findings": [{"id": f.test_id, **f.to_dict(), "doc": doc_ref(f)} for f in report.findings],
        }
        return json.dumps(doc, indent=2, default=str) + "\n"

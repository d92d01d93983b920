"""JSON report with a schema version, for machines."""

from __future__ import annotations

import json

from kvgate import __version__
from kvgate.findings import Report
from kvgate.formats.base import Formatter

SCHEMA_VERSION = 1


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
            "findings": [f.to_dict() for f in report.findings],
        }
        return json.dumps(doc, indent=2, default=str) + "\n"

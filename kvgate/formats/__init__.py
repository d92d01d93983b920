"""Report formats: one small class per format, chosen by the `ReportFormat` enum.

The enum is imported by every command's option declarations, so it stays light: a formatter module
(Rich, ElementTree) loads only when a report is rendered, not for `--help`.
"""

from __future__ import annotations

from enum import Enum
from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvgate.formats.base import Formatter


class ReportFormat(str, Enum):
    """Names accepted by `--format`."""

    TABLE = "table"
    JSON = "json"
    JUNIT = "junit"
    MARKDOWN = "markdown"
    SARIF = "sarif"
    HTML = "html"

    def formatter(self) -> Formatter:
        module, cls = _FORMATTERS[self].rsplit(".", 1)
        return getattr(import_module(module), cls)()


_FORMATTERS: dict[ReportFormat, str] = {
    ReportFormat.TABLE: "kvgate.formats.table.TableFormatter",
    ReportFormat.JSON: "kvgate.formats.json_report.JsonFormatter",
    ReportFormat.JUNIT: "kvgate.formats.junit.JunitFormatter",
    ReportFormat.MARKDOWN: "kvgate.formats.markdown.MarkdownFormatter",
    ReportFormat.SARIF: "kvgate.formats.sarif.SarifFormatter",
    ReportFormat.HTML: "kvgate.formats.html.HtmlFormatter",
}

__all__ = ["ReportFormat"]

"""Report formats: one small class per format, chosen by the `ReportFormat` enum."""

from __future__ import annotations

from enum import Enum

from kvgate.formats.base import Formatter
from kvgate.formats.json import JsonFormatter
from kvgate.formats.junit import JunitFormatter
from kvgate.formats.markdown import MarkdownFormatter
from kvgate.formats.table import TableFormatter


class ReportFormat(str, Enum):
    """Names accepted by `--format`."""

    TABLE = "table"
    JSON = "json"
    JUNIT = "junit"
    MARKDOWN = "markdown"

    def formatter(self) -> Formatter:
        return _FORMATTERS[self]()


_FORMATTERS: dict[ReportFormat, type[Formatter]] = {
    ReportFormat.TABLE: TableFormatter,
    ReportFormat.JSON: JsonFormatter,
    ReportFormat.JUNIT: JunitFormatter,
    ReportFormat.MARKDOWN: MarkdownFormatter,
}

__all__ = ["Formatter", "ReportFormat"]

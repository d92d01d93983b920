"""The formatter interface."""

from __future__ import annotations

from abc import ABC, abstractmethod

from kvgate.results.findings import Report


class Formatter(ABC):
    """Turns a report into text. Formatters never decide the exit status."""

    @abstractmethod
    def render(self, report: Report) -> str:
        """The whole report as one string."""

"""kvgate: deploy gate and backport toolkit for SGLang prefill/decode disaggregation.

Data flows one way: target -> gates -> findings -> report -> exit code.
"""

from __future__ import annotations

__version__ = "0.1.0"

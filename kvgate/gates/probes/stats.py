"""One-sided two-sample Kolmogorov-Smirnov test (no scipy), as Gu et al. (ICML 2025) use for timing.

H0: long prompts' latencies come from the same distribution as one-page prompts'. H1: long prompts are
slower (their CDF lies below). Statistic D+ = max_x (F_short(x) - F_long(x)). The p-value is exact:
under H0 every interleaving of the pooled sorted sample is equally likely, so P(D+ >= d) is the
probability that a random lattice path from (0, 0) to (n, m) touches the line i/n - j/m = d.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

_EPS = 1e-12


@dataclass(frozen=True)
class KsResult:
    """Outcome of the test and what it was computed from."""

    d_plus: float
    p_value: float
    n_short: int
    n_long: int
    median_short: float
    median_long: float

    def significant(self, alpha: float) -> bool:
        return self.p_value < alpha


def d_plus(short: Sequence[float], long: Sequence[float]) -> float:
    """max_x (F_short(x) - F_long(x)), ties handled by stepping both samples at once."""
    a, b = sorted(short), sorted(long)
    n, m = len(a), len(b)
    i = j = 0
    best = 0.0
    while i < n or j < m:
        x = min(a[i] if i < n else float("inf"), b[j] if j < m else float("inf"))
        while i < n and a[i] == x:
            i += 1
        while j < m and b[j] == x:
            j += 1
        best = max(best, i / n - j / m)
    return best


def p_value_one_sided(n: int, m: int, d: float) -> float:
    """Exact P(D+ >= d) under H0 for sample sizes n (short) and m (long), no ties."""
    if d <= 0:
        return 1.0
    # row[j]: probability of reaching (i, j) without touching i/n - j/m >= d. From (i, j) the next
    # pooled value is a short sample with probability (n - i) / (n + m - i - j).
    prev: list[float] = []
    for i in range(n + 1):
        row = [0.0] * (m + 1)
        for j in range(m + 1):
            if i == 0 and j == 0:
                p = 1.0
            else:
                p = 0.0
                if i > 0:
                    p += prev[j] * (n - i + 1) / (n + m - i + 1 - j)
                if j > 0:
                    p += row[j - 1] * (m - j + 1) / (n + m - i - j + 1)
            if i / n - j / m >= d - _EPS:
                p = 0.0
            row[j] = p
        prev = row
    return max(0.0, min(1.0, 1.0 - prev[m]))


def ks_long_slower(short: Sequence[float], long: Sequence[float]) -> KsResult:
    """Test whether `long` latencies are stochastically larger than `short` ones."""
    if not short or not long:
        raise ValueError("both samples must be non-empty")
    d = d_plus(short, long)
    return KsResult(
        d,
        p_value_one_sided(len(short), len(long), d),
        len(short),
        len(long),
        statistics.median(short),
        statistics.median(long),
    )

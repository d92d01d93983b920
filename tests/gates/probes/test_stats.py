"""The one-sided two-sample KS test against closed forms."""

from __future__ import annotations

from math import comb

import pytest

from kvgate.gates.probes.stats import d_plus, ks_long_slower, p_value_one_sided


@pytest.mark.parametrize("n", [3, 8, 25])
def test_exact_p_matches_closed_form_for_equal_sizes(n: int) -> None:
    # For n = m, P(D+ >= k/n) = C(2n, n-k) / C(2n, n) (Gnedenko-Korolyuk).
    for k in range(1, n + 1):
        assert p_value_one_sided(n, n, k / n) == pytest.approx(comb(2 * n, n - k) / comb(2 * n, n), abs=1e-12)


def test_unequal_sizes_full_separation() -> None:
    # every long sample above every short one: only 1 of C(n+m, n) orderings
    assert p_value_one_sided(4, 6, 1.0) == pytest.approx(1 / comb(10, 4))


def test_direction_is_one_sided() -> None:
    slow = ks_long_slower([1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 15])
    fast = ks_long_slower([10, 11, 12, 13, 14, 15], [1, 2, 3, 4, 5, 6])
    assert slow.d_plus == 1.0 and slow.p_value < 0.01 and slow.significant(0.01)
    assert fast.d_plus == 0.0 and fast.p_value == 1.0


def test_ties() -> None:
    assert d_plus([1, 1, 2], [1, 1, 2]) == 0.0
    assert d_plus([1, 2], [2, 3]) == pytest.approx(0.5)

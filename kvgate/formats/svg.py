"""Inline SVG plots for the HTML report: drawn here in Python, no script, no network. Every label is
escaped (names come from servers: hostile text)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

#: series colours (colour-blind safe, Okabe-Ito)
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
#: outcome colours of the verdict strips
OUTCOME_COLOURS = {
    "passed": "#2e7d32",
    "failed": "#c62828",
    "inconclusive": "#f9a825",
    "error": "#6a1b9a",
    "skipped": "#9e9e9e",
}

W, H = 720, 240
LEFT, RIGHT, TOP, BOTTOM = 64, 160, 28, 36

Series = tuple[str, Sequence[tuple[float, float]]]


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _nice(v: float) -> str:
    return f"{v:.3g}"


def line_chart(title: str, series: Sequence[Series], x_label: str, y_label: str, y_min: float = 0.0) -> str:
    """A line chart: one polyline and one circle per point for each series, a legend on the right."""
    pts = [p for _, ps in series for p in ps]
    if not pts:
        return _empty(title, "no data points")
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y1 = max(max(p[1] for p in pts), y_min + 1e-9)
    x1 = x1 if x1 > x0 else x0 + 1.0
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return TOP + ph - (y - y_min) / (y1 - y_min) * ph

    out = [_frame(title, x_label, y_label)]
    for i in range(5):  # y grid
        y = y_min + (y1 - y_min) * i / 4
        out.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}"/>')
        out.append(f'<text class="tick" x="{LEFT - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{_nice(y)}</text>')
    for i in range(5):
        x = x0 + (x1 - x0) * i / 4
        out.append(f'<text class="tick" x="{sx(x):.1f}" y="{TOP + ph + 16}" text-anchor="middle">{_nice(x)}</text>')
    for n, (name, ps) in enumerate(series):
        colour = PALETTE[n % len(PALETTE)]
        if len(ps) > 1:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in ps)
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{path}"/>')
        for x, y in ps:
            out.append(
                f'<circle class="pt" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{colour}">'
                f"<title>{_e(name)}: {_nice(x)}, {_nice(y)}</title></circle>"
            )
        ly = TOP + 14 * n + 6
        out.append(f'<rect x="{W - RIGHT + 12}" y="{ly - 8}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text class="legend" x="{W - RIGHT + 26}" y="{ly + 1}">{_e(_short(name))}</text>')
    out.append("</svg>")
    return "\n".join(out)


def strip(title: str, cells: Sequence[tuple[str, str, str]], x_label: str) -> str:
    """A verdict strip: one coloured cell per item (label, outcome, tooltip)."""
    if not cells:
        return _empty(title, "nothing judged")
    pw = W - LEFT - RIGHT
    cw = pw / len(cells)
    out = [f'<svg class="plot" viewBox="0 0 {W} 110" width="{W}" height="110" role="img" aria-label="{_e(title)}">']
    out.append(f'<text class="title" x="{LEFT}" y="18">{_e(title)}</text>')
    for i, (label, outcome, tip) in enumerate(cells):
        colour = OUTCOME_COLOURS.get(outcome, "#9e9e9e")
        x = LEFT + i * cw
        out.append(
            f'<rect class="cell {_e(outcome)}" x="{x + 1:.1f}" y="30" width="{max(cw - 2, 1):.1f}" height="40" '
            f'fill="{colour}"><title>{_e(label)}: {_e(outcome)}: {_e(tip)}</title></rect>'
        )
        if cw >= 24:
            out.append(f'<text class="tick" x="{x + cw / 2:.1f}" y="86" text-anchor="middle">{_e(label)}</text>')
    out.append(f'<text class="axis" x="{LEFT + pw / 2}" y="104" text-anchor="middle">{_e(x_label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def timeline(title: str, bars: Sequence[tuple[str, float, float, str]]) -> str:
    """A Gantt chart: one bar per item (label, start s, seconds, outcome), in order."""
    if not bars:
        return _empty(title, "nothing ran")
    end = max(s + d for _, s, d, _ in bars) or 1.0
    pw = W - LEFT - RIGHT
    row = 18
    h = TOP + row * len(bars) + BOTTOM
    out = [f'<svg class="plot" viewBox="0 0 {W} {h}" width="{W}" height="{h}" role="img" aria-label="{_e(title)}">']
    out.append(f'<text class="title" x="{LEFT}" y="18">{_e(title)}</text>')
    for i, (label, start, secs, outcome) in enumerate(bars):
        y = TOP + i * row
        x = LEFT + start / end * pw
        w = max(secs / end * pw, 2.0)
        colour = OUTCOME_COLOURS.get(outcome, "#0072B2")
        out.append(
            f'<rect class="bar" x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 4}" fill="{colour}">'
            f"<title>{_e(label)}: from {start:.2f} s, {secs:.2f} s, {_e(outcome)}</title></rect>"
        )
        out.append(f'<text class="legend" x="{W - RIGHT + 8}" y="{y + 11}">{_e(_short(label))}</text>')
    out.append(
        f'<text class="axis" x="{LEFT + pw / 2}" y="{h - 8}" text-anchor="middle">seconds since the start '
        f"(0 to {end:.1f})</text>"
    )
    out.append("</svg>")
    return "\n".join(out)


def _frame(title: str, x_label: str, y_label: str) -> str:
    ph = H - TOP - BOTTOM
    return (
        f'<svg class="plot" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{_e(title)}">\n'
        f'<text class="title" x="{LEFT}" y="18">{_e(title)}</text>\n'
        f'<line class="axisline" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + ph}"/>\n'
        f'<line class="axisline" x1="{LEFT}" x2="{W - RIGHT}" y1="{TOP + ph}" y2="{TOP + ph}"/>\n'
        f'<text class="axis" x="{(LEFT + W - RIGHT) / 2}" y="{H - 4}" text-anchor="middle">{_e(x_label)}</text>\n'
        f'<text class="axis" x="14" y="{TOP + ph / 2}" transform="rotate(-90 14 {TOP + ph / 2})" '
        f'text-anchor="middle">{_e(y_label)}</text>'
    )


def _empty(title: str, why: str) -> str:
    return (
        f'<svg class="plot empty" viewBox="0 0 {W} 60" width="{W}" height="60" role="img" aria-label="{_e(title)}">'
        f'<text class="title" x="{LEFT}" y="18">{_e(title)}</text>'
        f'<text class="tick" x="{LEFT}" y="44">{_e(why)}</text></svg>'
    )


def _short(name: str, n: int = 24) -> str:
    return name if len(name) <= n else name[: n - 1] + "\u2026"

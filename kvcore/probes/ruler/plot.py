"""Score against compression ratio as an SVG, one line per method (kvcore draws without Qt: a small writer)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from kvcore.atomic import write_text
from kvcore.probes.ruler.table import ratio_column

#: Line colours (Okabe–Ito, distinguishable by colour-blind readers), reused in order.
COLOURS: tuple[str, ...] = (
    "#000000",
    "#e69f00",
    "#56b4e9",
    "#009e73",
    "#f0e442",
    "#0072b2",
    "#d55e00",
    "#cc79a7",
)
_W, _H, _LEFT, _RIGHT, _TOP, _BOTTOM = 640, 400, 60, 150, 30, 50


def svg_text(rows: Sequence[Mapping[str, Any]], ratios: Sequence[float], title: str) -> str:
    """The SVG document: x = compression ratio (0 … 1), y = score (0 … 100), a legend on the right."""
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(v: float) -> float:
        return _LEFT + v * pw

    def y(v: float) -> float:
        return _TOP + (1 - v / 100) * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{_W}" height="{_H}" fill="white"/>',
        f'<text x="{_W / 2}" y="18" text-anchor="middle" font-size="13">{escape(title)}</text>',
        f'<rect x="{_LEFT}" y="{_TOP}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>',
    ]
    for tick in (0, 0.25, 0.5, 0.75, 1.0):
        out.append(f'<text x="{x(tick):.1f}" y="{_TOP + ph + 16}" text-anchor="middle">{tick:g}</text>')
    for tick in (0, 25, 50, 75, 100):
        out.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#eee"/>'
        )
        out.append(f'<text x="{_LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick}</text>')
    out.append(
        f'<text x="{_LEFT + pw / 2}" y="{_H - 12}" text-anchor="middle">compression ratio (1 − retention)</text>'
    )
    out.append(
        f'<text x="16" y="{_TOP + ph / 2}" transform="rotate(-90 16 {_TOP + ph / 2})" text-anchor="middle">score</text>'
    )
    for i, r in enumerate(rows):
        colour = COLOURS[i % len(COLOURS)]
        points = " ".join(f"{x(v):.1f},{y(float(r[ratio_column(v)])):.1f}" for v in sorted(ratios))
        out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for v in ratios:
            out.append(
                f'<circle cx="{x(v):.1f}" cy="{y(float(r[ratio_column(v)])):.1f}" r="3" fill="{colour}"/>'
            )
        ly = _TOP + 10 + 18 * i
        out.append(
            f'<line x1="{_W - _RIGHT + 12}" x2="{_W - _RIGHT + 32}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="2"/>'
        )
        out.append(f'<text x="{_W - _RIGHT + 38}" y="{ly + 4}">{escape(str(r["method"]))}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_svg(
    path: str | os.PathLike, rows: Sequence[Mapping[str, Any]], ratios: Sequence[float], title: str
) -> None:
    """Write the plot atomically."""
    write_text(path, svg_text(rows, ratios, title))

"""Small, dependency-free SVG charts for the run report (`phalanx.jepsen.report`).

Owns: `Chart`, one chart with a linear time axis (x) and a linear or log-10 value axis (y):
scatter series, step series, shaded x-bands, dotted x-lines, a legend, and `Chart.svg()`,
which returns the whole drawing as one standalone SVG document.

Why not matplotlib: the report draws two plots, and matplotlib with its dependencies was
~170 MB of every install (issue 22). The output depends only on the data given (no clocks,
no fonts read, no randomness); every text is XML-escaped; coordinates are rounded to 0.1 px
so equal inputs give equal bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Final

WIDTH: Final = 1000
_LEFT: Final = 64
_RIGHT: Final = 16
_TOP: Final = 30
_BOTTOM: Final = 42
_MARKERS: Final = ("circle", "triangle", "square", "diamond")


def _f(x: float) -> str:
    """A coordinate rounded to 0.1 px, without a trailing ``.0``."""
    text = f"{x:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _nice_step(span: float, target: int) -> float:
    """A 1/2/5 x 10^k step that cuts `span` into about `target` pieces."""
    raw = span / max(target, 1)
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for mult in (1, 2, 5, 10):
        if raw <= mult * power:
            return float(mult * power)
    return float(10 * power)


def _tick_label(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 0.01:
        return f"{v:g}"
    return f"{v:.3f}".rstrip("0").rstrip(".")


@dataclass(slots=True)
class _Series:
    label: str
    color: str
    kind: str  # "scatter" or "step"
    xs: list[float]
    ys: list[float]
    marker: str = "circle"


@dataclass(slots=True)
class Chart:
    """One chart; add series, bands and lines, then call `svg()`."""

    title: str
    x_label: str
    y_label: str
    x_max: float
    height: int = 360
    log_y: bool = False
    _series: list[_Series] = field(default_factory=list)
    _bands: list[tuple[float, float]] = field(default_factory=list)
    _lines: list[float] = field(default_factory=list)

    def scatter(
        self, xs: Sequence[float], ys: Sequence[float], *, label: str, color: str, marker: int = 0
    ) -> None:
        """Points (x, y); `marker` picks one of four shapes (by index, wrapping)."""
        self._series.append(
            _Series(label, color, "scatter", list(xs), list(ys), _MARKERS[marker % len(_MARKERS)])
        )

    def steps(self, xs: Sequence[float], ys: Sequence[float], *, label: str, color: str) -> None:
        """A step line through (x, y), each step centred on its x."""
        self._series.append(_Series(label, color, "step", list(xs), list(ys)))

    def band(self, start: float, stop: float) -> None:
        """A shaded vertical band from x = start to x = stop."""
        self._bands.append((start, stop))

    def line(self, x: float) -> None:
        """A dotted vertical line at x."""
        self._lines.append(x)

    # -- layout ---------------------------------------------------------------------------

    def _y_range(self) -> tuple[float, float]:
        ys = [y for s in self._series for y in s.ys]
        if self.log_y:
            pos = [y for y in ys if y > 0] or [1.0]
            lo = 10 ** math.floor(math.log10(min(pos) * 0.9))  # headroom: no point on the frame
            hi = 10 ** math.ceil(math.log10(max(pos) * 1.1))
            return lo, hi if hi > lo else lo * 10
        top = max(ys, default=1.0) * 1.05
        step = _nice_step(top if top > 0 else 1.0, 5)
        return 0.0, step * math.ceil((top if top > 0 else 1.0) / step)

    def svg(self) -> str:
        """The chart as a standalone SVG document (UTF-8 text)."""
        w, h = WIDTH, self.height
        pw, ph = w - _LEFT - _RIGHT, h - _TOP - _BOTTOM
        x_max = max(self.x_max, 1e-3)
        y_lo, y_hi = self._y_range()

        def sx(x: float) -> float:
            return _LEFT + pw * min(max(x, 0.0), x_max) / x_max

        def sy(y: float) -> float:
            if self.log_y:
                y = max(y, y_lo)
                frac = (math.log10(y) - math.log10(y_lo)) / (math.log10(y_hi) - math.log10(y_lo))
            else:
                frac = (y - y_lo) / (y_hi - y_lo)
            return _TOP + ph * (1.0 - min(max(frac, 0.0), 1.0))

        out: list[str] = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
            f'viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">',
            f'<rect x="0" y="0" width="{w}" height="{h}" fill="#fff"/>',
            f'<text x="{w / 2:.0f}" y="18" text-anchor="middle" font-size="14">'
            f"{escape(self.title)}</text>",
        ]
        for start, stop in self._bands:
            x0, x1 = sx(start), sx(stop)
            out.append(
                f'<rect class="nemesis" x="{_f(x0)}" y="{_TOP}" width="{_f(max(x1 - x0, 0.5))}" '
                f'height="{ph}" fill="#888" fill-opacity="0.15"/>'
            )
        # axes, grid and ticks
        x_step = _nice_step(x_max, 10)
        k = 0
        while k * x_step <= x_max + 1e-9:
            x = sx(k * x_step)
            out.append(f'<line x1="{_f(x)}" y1="{_TOP + ph}" x2="{_f(x)}" y2="{_TOP + ph + 4}" '
                       'stroke="#333"/>')
            out.append(f'<text x="{_f(x)}" y="{_TOP + ph + 16}" text-anchor="middle">'
                       f"{_tick_label(k * x_step)}</text>")
            k += 1
        if self.log_y:
            ticks = [10.0**e for e in range(round(math.log10(y_lo)), round(math.log10(y_hi)) + 1)]
        else:
            y_step = _nice_step(y_hi - y_lo, 5)
            ticks = [y_lo + i * y_step for i in range(round((y_hi - y_lo) / y_step) + 1)]
        for t in ticks:
            y = sy(t)
            out.append(f'<line x1="{_LEFT}" y1="{_f(y)}" x2="{_LEFT + pw}" y2="{_f(y)}" '
                       'stroke="#eee"/>')
            out.append(f'<text x="{_LEFT - 6}" y="{_f(y + 4)}" text-anchor="end">'
                       f"{_tick_label(t)}</text>")
        out.append(f'<rect x="{_LEFT}" y="{_TOP}" width="{pw}" height="{ph}" fill="none" '
                   'stroke="#333"/>')
        for x in self._lines:
            out.append(f'<line x1="{_f(sx(x))}" y1="{_TOP}" x2="{_f(sx(x))}" y2="{_TOP + ph}" '
                       'stroke="#555" stroke-dasharray="2,3"/>')
        for s in self._series:
            out.append(self._draw(s, sx, sy))
        out.append(f'<text x="{_LEFT + pw / 2:.0f}" y="{h - 8}" text-anchor="middle">'
                   f"{escape(self.x_label)}</text>")
        out.append(f'<text transform="translate(14,{_TOP + ph / 2:.0f}) rotate(-90)" '
                   f'text-anchor="middle">{escape(self.y_label)}</text>')
        out.extend(self._legend())
        out.append("</svg>")
        return "\n".join(out) + "\n"

    @staticmethod
    def _draw(s: _Series, sx: Callable[[float], float], sy: Callable[[float], float]) -> str:
        if s.kind == "step":
            points: list[str] = []
            for i, (x, y) in enumerate(zip(s.xs, s.ys, strict=True)):
                left = x - 0.5 if i == 0 else (s.xs[i - 1] + x) / 2
                right = x + 0.5 if i == len(s.xs) - 1 else (x + s.xs[i + 1]) / 2
                points.append(f"{_f(sx(left))},{_f(sy(y))} {_f(sx(right))},{_f(sy(y))}")
            return (f'<polyline class="series" data-label="{escape(s.label)}" fill="none" '
                    f'stroke="{s.color}" stroke-width="1.5" points="{" ".join(points)}"/>')
        shapes = [_marker(s.marker, sx(x), sy(y)) for x, y in zip(s.xs, s.ys, strict=True)]
        return (f'<g class="series" data-label="{escape(s.label)}" fill="{s.color}" '
                f'fill-opacity="0.7">{"".join(shapes)}</g>')

    def _legend(self) -> list[str]:
        out: list[str] = []
        x, y = _LEFT + 8, _TOP + 14
        for s in self._series:
            label = escape(s.label)
            sample = (_marker(s.marker, x + 5, y - 4) if s.kind == "scatter" else
                      f'<line x1="{x}" y1="{y - 4}" x2="{x + 12}" y2="{y - 4}" stroke="{s.color}" '
                      'stroke-width="2"/>')
            out.append(f'<g fill="{s.color}">{sample}</g><text x="{x + 16}" y="{y}">{label}</text>')
            x += 24 + 7 * len(s.label)
            if x > WIDTH - 160:
                x, y = _LEFT + 8, y + 14
        if self._bands:
            out.append(f'<rect x="{x}" y="{y - 9}" width="12" height="9" fill="#888" '
                       f'fill-opacity="0.3"/><text x="{x + 16}" y="{y}">nemesis</text>')
        return out


def _marker(shape: str, x: float, y: float) -> str:
    if shape == "triangle":
        return f'<path d="M{_f(x)},{_f(y - 3)}l3,5.5h-6z"/>'
    if shape == "square":
        return f'<rect x="{_f(x - 2.5)}" y="{_f(y - 2.5)}" width="5" height="5"/>'
    if shape == "diamond":
        return f'<path d="M{_f(x)},{_f(y - 3.5)}l3.5,3.5l-3.5,3.5l-3.5,-3.5z"/>'
    return f'<circle cx="{_f(x)}" cy="{_f(y)}" r="2.5"/>'

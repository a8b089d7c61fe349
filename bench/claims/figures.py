"""The figure of ``docs/concepts`` (``docs/_static/algorithms.svg``), drawn from the real logic.

One trace of requests goes to both algorithms at once: the sliding window (through
:mod:`ratelimit_app.algorithms.windows`, as :class:`bench.claims.accuracy.Buckets` runs it) and
the leaky
bucket (through :mod:`ratelimit_app.algorithms.gcra`). The upper panel plots how many admitted
requests the last ``W`` seconds hold, the lower one the bucket's level; dots are admitted
requests, crosses refused ones. ``tests/test_bench.py`` checks that the committed file is
what this module draws.

Run: ``python -m bench.claims.figures`` (writes the SVG).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.claims.accuracy import Buckets
from bench.common import configure_django
from ratelimit_app.algorithms import gcra
from ratelimit_app.algorithms.rates import Rate

PATH = Path(__file__).resolve().parents[2] / "docs" / "_static" / "algorithms.svg"
#: Both algorithms: 4 per 10 s (the leaky bucket: one leaks out every 2.5 s, capacity 4).
COUNT, WINDOW, BURST = 4, 10, 4
HORIZON = 30.0
WIDTH, LEFT, RIGHT = 760, 60, 740
PANEL, GAP, TOP = 150, 46, 34
ADMITTED, REFUSED, LINE, LIMIT, TEXT = "#2a7f62", "#c0392b", "#2f5d8a", "#888", "#222"


def trace() -> list[float]:
    """A burst of 6, then twice the rate for 11 s, a pause, a burst of 5, a few late ones."""
    times = [1.0 + 0.25 * i for i in range(6)]
    times += [3.5 + 1.25 * i for i in range(9)]
    times += [20.0 + 0.25 * i for i in range(5)]
    times += [24.0, 26.0, 27.0, 28.0]
    return times


@dataclass
class Outcome:
    """Each algorithm's decisions on the trace, and what to plot."""

    times: list[float]
    window: list[bool]
    bucket: list[bool]
    #: (time, level) points of the bucket's level, a polyline.
    levels: list[tuple[float, float]]


def simulate() -> Outcome:
    times = trace()
    sliding = Buckets(COUNT, WINDOW, refund=True)
    meter = gcra.meter((Rate(COUNT, WINDOW),), BURST)
    tat: int | None = None
    window, bucket, levels = [], [], [(0.0, 0.0)]
    for t in times:
        window.append(sliding.allow(t))
        now = gcra.micros(t)
        before = gcra.evaluate(meter, tat, now, False)
        if tat is not None and before.level == 0 and levels[-1][1] > 0:
            levels.append((tat / meter.rate.count / gcra.MICROS, 0.0))  # emptied meanwhile
        levels.append((t, before.level))
        state = gcra.evaluate(meter, tat, now, True)
        bucket.append(state.admitted)
        tat = state.tat
        levels.append((t, state.level))
    assert tat is not None
    empty = tat / meter.rate.count / gcra.MICROS
    levels += [(min(empty, HORIZON), max(0.0, (empty - HORIZON) * COUNT / WINDOW))]
    if empty < HORIZON:
        levels.append((HORIZON, 0.0))
    return Outcome(times, window, bucket, levels)


def in_window(times: list[float], admitted: list[bool]) -> list[tuple[float, float]]:
    """(time, admitted requests in the last WINDOW seconds) as a step polyline."""
    changes = sorted(
        [(t, 1) for t, ok in zip(times, admitted, strict=True) if ok]
        + [(t + WINDOW, -1) for t, ok in zip(times, admitted, strict=True) if ok]
    )
    points, count = [(0.0, 0.0)], 0
    for t, step in changes:
        if t > HORIZON:
            break
        points.append((t, count))
        count += step
        points.append((t, count))
    points.append((HORIZON, count))
    return [(t, float(c)) for t, c in points]


def _x(t: float) -> float:
    return LEFT + (RIGHT - LEFT) * t / HORIZON


def _panel(
    top: float,
    title: str,
    line: list[tuple[float, float]],
    limit: float,
    label: str,
    times: list[float],
    admitted: list[bool],
) -> list[str]:
    scale, plot = 6.0, PANEL - 30
    base = top + plot

    def y(value: float) -> float:
        return base - plot * value / scale

    out = [
        f'<text x="{LEFT}" y="{top - 10}" class="title">{title}</text>',
        f'<line x1="{LEFT}" y1="{base}" x2="{RIGHT}" y2="{base}" class="axis"/>',
        f'<line x1="{LEFT}" y1="{top}" x2="{LEFT}" y2="{base}" class="axis"/>',
        f'<line x1="{LEFT}" y1="{y(limit):.1f}" x2="{RIGHT}" y2="{y(limit):.1f}" class="limit"/>',
        f'<text x="{RIGHT}" y="{y(limit) - 4:.1f}" class="note" text-anchor="end">{label}</text>',
    ]
    for v in range(0, 7, 2):
        out.append(
            f'<text x="{LEFT - 8}" y="{y(v) + 4:.1f}" class="tick" text-anchor="end">{v}</text>'
        )
    points = " ".join(f"{_x(t):.1f},{y(v):.1f}" for t, v in line)
    out.append(f'<polyline points="{points}" class="value"/>')
    for t, ok in zip(times, admitted, strict=True):
        cx, cy = _x(t), base + 14
        if ok:
            out.append(f'<circle cx="{cx:.1f}" cy="{cy}" r="3.2" class="ok"/>')
        else:
            out.append(f'<path d="M{cx - 3:.1f},{cy - 3} l6,6 m0,-6 l-6,6" class="refused"/>')
    return out


def svg() -> str:
    """The figure as SVG text (deterministic)."""
    o = simulate()
    second = TOP + PANEL + GAP
    axis = second + PANEL - 30 + 34  # the time labels, under the second panel's marks
    height = axis + 12
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">',
        "<title>The same requests through a sliding window and a leaky bucket</title>",
        "<style>"
        f".title{{font-weight:bold;fill:{TEXT}}} .note,.tick{{fill:{TEXT}}} "
        f".axis{{stroke:{TEXT};stroke-width:1}} "
        f".limit{{stroke:{LIMIT};stroke-dasharray:5 4;stroke-width:1}} "
        f".value{{fill:none;stroke:{LINE};stroke-width:2}} .ok{{fill:{ADMITTED}}} "
        f".refused{{stroke:{REFUSED};stroke-width:1.8;fill:none}}"
        "</style>",
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    parts += _panel(
        TOP,
        f"Sliding window: at most {COUNT} in any {WINDOW} s "
        "(line: admitted requests in the last 10 s)",
        in_window(o.times, o.window),
        COUNT,
        f"limit N = {COUNT}",
        o.times,
        o.window,
    )
    parts += _panel(
        second,
        f"Leaky bucket: {COUNT} leak out per {WINDOW} s (one every 2.5 s), capacity {BURST} "
        "(line: the level)",
        o.levels,
        BURST,
        f"capacity B = {BURST}",
        o.times,
        o.bucket,
    )
    for t in range(0, int(HORIZON) + 1, 5):
        parts.append(
            f'<text x="{_x(t):.1f}" y="{axis}" class="tick" text-anchor="middle">{t} s</text>'
        )
    legend = TOP + PANEL + 14
    parts += [
        f'<circle cx="{RIGHT - 170}" cy="{legend - 4}" r="3.2" class="ok"/>',
        f'<text x="{RIGHT - 162}" y="{legend}" class="note">admitted</text>',
        f'<path d="M{RIGHT - 93},{legend - 7} l6,6 m0,-6 l-6,6" class="refused"/>',
        f'<text x="{RIGHT - 82}" y="{legend}" class="note">refused</text>',
        "</svg>",
    ]
    return "\n".join(parts) + "\n"


def main() -> None:
    configure_django()
    PATH.parent.mkdir(parents=True, exist_ok=True)
    PATH.write_text(svg(), encoding="utf-8")
    print(f"wrote {PATH}")


if __name__ == "__main__":
    main()

"""Helpers shared by the benchmarks: Django set-up, throwaway servers, statistics, tables."""

from __future__ import annotations

import argparse
import math
import platform
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tests.servers import Server, start_memcached, start_redis


def configure_django() -> None:
    """Configure a minimal Django in-process unless settings are already configured.

    Benchmarks then point ``CACHES`` at their own servers with ``override_settings``, so the
    same code runs under ``python -m bench`` and under pytest (``tests.settings``).
    """
    import django
    from django.conf import settings

    if settings.configured:
        return
    settings.configure(
        SECRET_KEY="bench-not-secret",
        DEBUG=False,
        ALLOWED_HOSTS=["*"],
        INSTALLED_APPS=["ratelimit_app"],
        CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
        USE_TZ=True,
    )
    django.setup()


def timing_parser(doc: str) -> argparse.ArgumentParser:
    """A command line with the options of every interleaved latency benchmark."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds")
    parser.add_argument("--calls", type=int, default=300, help="checks per round")
    parser.add_argument("--ips", type=int, default=100, help="client IPs in the pool")
    return parser


@dataclass
class Servers:
    """A memcached ``address`` ("127.0.0.1:PORT") and a Redis ``url``."""

    memcached: str
    redis: str


@contextmanager
def throwaway_servers() -> Iterator[Servers]:
    """Start a private memcached and Redis on free loopback ports; stop them at exit."""
    mc = start_memcached()
    rd: Server | None = None
    try:
        rd = start_redis()
        yield Servers(memcached=mc.address, redis=rd.url)
    finally:
        if rd is not None:
            rd.stop()
        mc.stop()


def quantile(samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``samples``, linear interpolation between ranks."""
    if not samples:
        raise ValueError("quantile of no samples")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table: numbers right-aligned, text left-aligned, a rule under headers."""
    cells = [[str(c) for c in headers]] + [[_cell(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [
        all(_is_number(row[i]) for row in rows) if rows else False for i in range(len(headers))
    ]

    def line(row: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if num else c.ljust(w)
            for c, w, num in zip(row, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [title, "=" * len(title), line(cells[0]), line(["-" * w for w in widths])]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def machine() -> dict[str, str]:
    """What the numbers were measured on: cores, CPU model, Python, server versions."""
    import os

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for raw in f:
                if raw.startswith("model name"):
                    cpu = raw.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cores": str(os.cpu_count()),
        "cpu": cpu,
        "python": platform.python_version(),
        "memcached": _version(["memcached", "-V"]),
        "redis": _version(["redis-server", "--version"]),
    }


def _version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "not installed"
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "?"

"""A key function no test imports: a database rule that names it must neither import nor
call it (tests/ratelimit/test_limits.py checks ``sys.modules`` and :data:`CALLS`)."""

from __future__ import annotations

from typing import Any

CALLS: list[str] = []


def key(group: str, request: Any) -> str:
    CALLS.append(group)
    return "canary"

"""Requests over a rule's limit, counted as the metrics series ``ratelimit:<rule>``, and
those a dry run would refuse as ``ratelimit-shadow:<rule>``.

Connected when ``metrics_app`` is installed: the admin then charts each rule's refused
requests over time like any other series (one in-memory increment per limited request).
"""

from __future__ import annotations

from typing import Any

from ratelimit_app.signals import ratelimited

SERIES_PREFIX = "ratelimit:"
#: The series of what a dry run would refuse.
SHADOW_PREFIX = "ratelimit-shadow:"


def series_name(rule: str, shadow: bool = False) -> str:
    """The metrics series of a rule's limited requests (``shadow``: of those its dry run
    would refuse)."""
    return (SHADOW_PREFIX if shadow else SERIES_PREFIX) + rule


def _count(sender: Any, rule: str | None = None, shadow: bool = False, **kwargs: Any) -> None:
    if rule is None:  # a decorator's limit: counted by its view, if at all
        return
    from metrics_app import record

    record(series_name(rule, shadow))


def connect() -> None:
    ratelimited.connect(_count, dispatch_uid="ratelimit_app.metrics")

"""Traffic metrics for Django: count in memory, flush every few seconds, keep a year small.

Public API::

    import metrics_app
    metrics_app.record("shorturl:aB3x")          # thread-safe, no I/O
    metrics_app.record_top("logins", key, keep=86400)  # among the top keys (bounded)
    metrics_app.flush()                           # write this process's buffer now
    metrics_app.query.series(name, start, end)    # zero-filled buckets
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from metrics_app.buffer import flush, record, record_top

__all__ = ["flush", "query", "record", "record_top"]

if TYPE_CHECKING:
    from metrics_app import query


def __getattr__(name: str) -> Any:
    # query imports the models, which needs the app registry: import it on first use.
    if name == "query":
        import importlib

        return importlib.import_module("metrics_app.query")
    raise AttributeError(name)

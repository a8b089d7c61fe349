"""The per-process buffer behind :func:`metrics_app.record`, and its flusher thread.

* :mod:`.aggregator`: the counts per ``(series, minute)``, batches, the memory bound;
* :mod:`.flusher`: writing batches to the database, the thread and its backoff;
* :mod:`.lifecycle`: exit, SIGTERM, fork and Celery hooks;
* :mod:`.process`: this process's one buffer, and the functions below that reach it.
"""

from __future__ import annotations

from metrics_app.buffer.lifecycle import SIGTERM_FLUSH_TIMEOUT
from metrics_app.buffer.process import (
    connect_celery_shutdown,
    current,
    flush,
    record,
    record_top,
    reset,
    stats,
)
from metrics_app.names import MAX_NAME_LENGTH

__all__ = [
    "MAX_NAME_LENGTH",
    "SIGTERM_FLUSH_TIMEOUT",
    "connect_celery_shutdown",
    "current",
    "flush",
    "record",
    "record_top",
    "reset",
    "stats",
]

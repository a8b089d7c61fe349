"""Signals metrics_app sends, so a site can alert on lost or stuck counts.

* ``buffer_full(sender, name, count, max_keys, bound)``: the in-process buffer was at a
  bound and a count for a new ``(name, minute)`` was dropped. ``bound`` names it:
  ``"MAX_BUFFERED_KEYS"`` (all keys), or ``"MAX_CLIENT_KEYS"`` (keys whose name a client
  chose), constants of :mod:`metrics_app.buffer.aggregator`; ``max_keys`` is its value. Sent
  once per flush interval and bound (the first drop), with an ERROR log line.
* ``flush_failed(sender, exception, buffered_keys, attempt)``: a flush raised; the counts stay
  buffered and are retried with backoff.
* ``flushed(sender, buckets, batches)``: a flush committed ``batches`` batches.
* ``downsampled(sender, result)``: a downsample run finished (``result`` is a
  :class:`metrics_app.rollup.DownsampleResult`).
"""

from __future__ import annotations

from django.dispatch import Signal

buffer_full = Signal()
flush_failed = Signal()
flushed = Signal()
downsampled = Signal()

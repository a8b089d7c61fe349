"""Signals metrics_app sends, so a site can alert on lost or stuck counts.

* ``buffer_full(sender, name, count, max_keys)``: the in-process buffer held
  ``METRICS_MAX_BUFFERED_KEYS`` keys and a count for a new ``(name, minute)`` was dropped.
  Sent once per flush interval (the first drop), with an ERROR log line.
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

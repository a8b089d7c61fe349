"""The process events a buffer must answer: exit, SIGTERM, fork, a Celery child's shutdown.

Nothing here knows what a buffer holds; :mod:`metrics_app.buffer.process` says what to call.

* **Exit.** ``atexit`` flushes what is left when the interpreter ends normally.
* **SIGTERM.** Under a server with a graceful shutdown of its own (gunicorn, Celery), its
  handler still runs, after a flush. With the default action, which would kill the process
  without ``atexit``, the process exits through ``SystemExit`` instead, so the ``atexit``
  flush runs.
* **Fork.** A forked child (gunicorn ``--preload``) gets a buffer of its own: the parent
  flushes what it recorded, the child starts its own thread on its first ``record()``.
* **Celery.** Prefork pool children leave through ``os._exit``, which skips ``atexit``: the
  ``worker_process_shutdown`` signal flushes them.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

from django.db import connections

logger = logging.getLogger("metrics_app")

#: Seconds a SIGTERM waits for its flush before the server's own handler runs.
SIGTERM_FLUSH_TIMEOUT = 10.0


class Flush(Protocol):
    """:func:`metrics_app.flush`'s signature."""

    def __call__(self, *, raise_errors: bool = True, blocking: bool = True) -> int | None: ...


class ExitHooks:
    """Flush at interpreter exit and on SIGTERM, installed once per process."""

    def __init__(self, flush: Flush, kept_keys: Callable[[], int]) -> None:
        self._flush = flush
        self._kept_keys = kept_keys  # what a failed final flush loses, for its log line
        self._pid: int | None = None
        self._previous_sigterm: Any = None

    def install(self, *, sigterm: bool) -> None:
        """Register the ``atexit`` flush, and with ``sigterm`` the SIGTERM handler.

        A forked child installs its own on its first ``record()``; the ``atexit`` flush it
        inherits from its parent does nothing in it, and the SIGTERM handler it inherits is
        the same one.
        """
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        atexit.register(self._at_exit)
        # Python runs signal handlers in the main thread only, and only it may set them.
        if sigterm and threading.current_thread() is threading.main_thread():
            current = signal.getsignal(signal.SIGTERM)
            # ``==``: each access to a bound method makes a new object, equal but not the same.
            if current != self._on_sigterm:
                self._previous_sigterm = current
                signal.signal(signal.SIGTERM, self._on_sigterm)

    def _at_exit(self) -> None:
        if os.getpid() != self._pid:
            return
        try:
            self._flush(raise_errors=True)
        except Exception:
            logger.exception("metrics: final flush failed; %d keys lost", self._kept_keys())

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous_sigterm
        if callable(previous):
            # The server's own graceful shutdown: flush what we can, then let it run; atexit
            # flushes the rest. The signal may have interrupted this thread inside a database
            # call (or holding the buffer's lock): flushing on its connection would wait on
            # itself, so the flush runs in a thread of its own, with its own connection.
            self._flush_beside(SIGTERM_FLUSH_TIMEOUT)
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        else:
            # The default action would kill us without atexit: exit through SystemExit
            # instead, which unwinds (releasing any lock) and runs the atexit flush.
            raise SystemExit(128 + signum)

    def _flush_beside(self, timeout: float) -> None:
        """Flush from a new thread (its own database connection); wait up to ``timeout``."""

        def run() -> None:
            try:
                self._flush(raise_errors=False, blocking=False)
            except Exception:  # pragma: no cover  (flush logs its own failures)
                logger.exception("metrics: flush on SIGTERM failed")
            finally:
                connections.close_all()  # this thread's own

        thread = threading.Thread(target=run, name="metrics-sigterm-flush", daemon=True)
        thread.start()
        thread.join(timeout)


def on_fork_in_child(renew: Callable[[], None]) -> None:
    """Call ``renew`` in every child this process forks (before it runs anything else)."""
    os.register_at_fork(after_in_child=renew)


def on_celery_child_shutdown(flush: Callable[[], object]) -> None:
    """Call ``flush`` as each Celery pool process shuts down (if Celery is installed)."""
    try:
        from celery.signals import worker_process_shutdown
    except ImportError:  # celery is an optional extra
        return

    def shutdown(**kwargs: Any) -> None:
        flush()

    worker_process_shutdown.connect(shutdown, weak=False, dispatch_uid="metrics_app.buffer")

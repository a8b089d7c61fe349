"""The limiter's state in a process, in one object: :data:`RUNTIME`.

Everything the limiter keeps between requests lives here, built from the settings on first
use: the values read (``settings``, the object :mod:`ratelimit_app.conf` reads through), the
compiled pieces a check is made of (``compiled``: a rate's bucket plan, a leaky bucket's
meter, a key's function, a limit built from its arguments, the ``RateLimit-Policy`` text), a
client's address as parsed, masked and judged a trusted proxy, the subjects' namespaces, each
limit's plan for its current fine bucket (``plans``), the configuration snapshot in force
(``snapshot``), and the parts higher layers build from the settings (``parts``: the
counter backends, the settings' rules and lists, the refusal memory, the URL names
resolved, the templates and messages of the answers).

Each memo is bounded by entries and starts over when full; docs/architecture lists them with
their bounds. A key is a value (a rate, a check, a plan), never an ``id()``: an entry keeps
its key alive, so no other object can be taken for it.

Django's ``setting_changed`` (``override_settings``, pytest-django's ``settings`` fixture)
reaches one receiver, here: when the setting is one the limiter builds from
(:data:`SETTINGS`, any ``RATELIMIT_*``), the runtime forgets everything and each part is
built again, from the new settings, when next used. A layer-0 module: it imports nothing of
the package; the layers above keep their parts in it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.core.signals import setting_changed
from django.dispatch import receiver

__all__ = ["RUNTIME", "SETTINGS", "Runtime", "affects", "forget", "kept"]

T = TypeVar("T")

#: The settings besides ``RATELIMIT_*`` that the runtime's parts are built from: the
#: backends (``CACHES``), the salt of the namespaces (``SECRET_KEY``), whether the middleware
#: keeps the snapshot fresh (``MIDDLEWARE``), the URL names (``ROOT_URLCONF``), the answers'
#: templates and messages (``TEMPLATES``, ``INSTALLED_APPS``, the language settings).
SETTINGS = frozenset(
    {
        "CACHES",
        "SECRET_KEY",
        "MIDDLEWARE",
        "ROOT_URLCONF",
        "TEMPLATES",
        "INSTALLED_APPS",
        "LANGUAGE_CODE",
        "LANGUAGES",
        "LOCALE_PATHS",
    }
)

#: Entries of ``compiled`` (each a few hundred bytes: a plan, a meter, a formatted policy).
COMPILED_MEMO = 4096

_MISSING: Any = object()


def affects(setting: str) -> bool:
    """True when a change of ``setting`` may change what the runtime built."""
    return setting.startswith("RATELIMIT_") or setting in SETTINGS


class Runtime:
    """What one process built from the settings, forgotten as a whole when they change.

    The memos are plain dictionaries, read without a call on the request path; the module
    that fills one bounds it (docs/architecture lists the bounds). ``parts`` holds what
    a higher layer builds, by the function that builds it (:meth:`part`).
    """

    __slots__ = (
        "_lock",
        "addresses",
        "compiled",
        "masked",
        "namespaces",
        "parts",
        "plans",
        "refusals",
        "settings",
        "snapshot",
        "trusted",
    )

    def __init__(self) -> None:
        self._lock = threading.RLock()
        #: The values read (a :class:`ratelimit_app.conf.Settings`, set by ``conf``).
        self.settings: Any = None
        #: The refusals remembered (a :class:`ratelimit_app.engine.refusals.memory.Memory`, set by
        #: ``engine.memory``): emptied, not replaced, so that a test's choice to remember
        #: every refusal outlives a changed setting.
        self.refusals: Any = None
        self.parts: dict[Callable[[], Any], Any] = {}
        self._fresh()

    def _fresh(self) -> None:
        #: A limit's pieces that do not depend on the subject, by what they are made from.
        self.compiled: dict[tuple[Any, ...], Any] = {}
        #: A limit's plan for its current fine bucket, by the limit's scope: (the bucket's
        #: index, the buckets per window, the plan).
        self.plans: dict[str, tuple[int, int, Any]] = {}
        #: A subject's namespace, by (group, kind, value).
        self.namespaces: dict[tuple[str, str, str], str] = {}
        #: A client's text: the address it holds, masked, and whether a trusted proxy (None:
        #: no address).
        self.addresses: dict[str, Any] = {}
        self.masked: dict[str, str | None] = {}
        self.trusted: dict[str, bool | None] = {}
        #: The configuration in force (a ``ratelimit_app.store.Snapshot``), or None.
        self.snapshot: Any = None

    def part(self, build: Callable[[], T]) -> T:
        """The part ``build`` makes, built on first use (once, whatever the threads)."""
        found = self.parts.get(build, _MISSING)
        if found is _MISSING:
            with self._lock:
                found = self.parts.get(build, _MISSING)
                if found is _MISSING:
                    found = self.parts[build] = build()
        return found

    def compile(self, key: tuple[Any, ...], make: Callable[..., T], *args: Any) -> T:
        """``make(*args)``, kept in ``compiled`` under ``key`` (a tuple that starts with
        what it is, then every value it is made from); a mistake it raises is not kept."""
        found = self.compiled.get(key, _MISSING)  # (the hit, without a call: every request)
        return kept(self.compiled, COMPILED_MEMO, key, make, *args) if found is _MISSING else found

    def drop(self, build: Callable[[], Any]) -> None:
        """Forget the part ``build`` made (closed, when it has a ``close()``)."""
        with self._lock:
            found = self.parts.pop(build, None)
        _close(found)

    def forget(self) -> None:
        """Forget everything: each part is built again, from the settings, when next used."""
        with self._lock:
            parts, self.parts = self.parts, {}
            if self.settings is not None:
                vars(self.settings).clear()
            if self.refusals is not None:
                self.refusals.clear()
            self._fresh()
        for found in parts.values():
            _close(found)


def kept(memo: dict[Any, Any], bound: int, key: Any, make: Callable[..., T], *args: Any) -> T:
    """``make(*args)``, kept in ``memo`` under ``key``; the memo starts over when it holds
    ``bound`` entries. A mistake ``make`` raises is not kept."""
    found = memo.get(key, _MISSING)
    if found is _MISSING:
        found = make(*args)
        if len(memo) >= bound:
            memo.clear()
        memo[key] = found
    return found


def _close(part: Any) -> None:
    close = getattr(part, "close", None)
    if callable(close):
        close()


#: The one runtime of the process.
RUNTIME = Runtime()


def forget(setting: str | None = None) -> None:
    """Forget what the runtime built, when ``setting`` (None: any) may have changed it."""
    if setting is None or affects(setting):
        RUNTIME.forget()


@receiver(setting_changed, dispatch_uid="ratelimit_app.runtime")
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    forget(setting)

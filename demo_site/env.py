"""The demo's settings from environment variables, each with an embedded default.

Pure parsing, apart from :func:`secret_key` (which keeps a generated key in a file): every
function takes the raw value and returns what ``settings.py`` needs, or raises
:class:`~django.core.exceptions.ImproperlyConfigured` naming the variable and what to write
instead. Passwords in URLs never appear in an error message.

============================  ============================================================
Variable                      Default
============================  ============================================================
``DATABASE_URL``              ``sqlite:///`` a file in the state directory
``MEMCACHED_SERVERS``         none: Django's local-memory cache
``REDIS_URL``                 none: local memory, Celery's filesystem broker
``DEBUG``                     ``true``
``ALLOWED_HOSTS``             ``127.0.0.1,localhost,[::1]``
``SECRET_KEY``                generated once, kept in ``<state dir>/secret_key``
``DEMO_STATE_DIR``            ``.demo`` in the project directory
============================  ============================================================
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})
POSTGRES_SCHEMES = frozenset({"postgres", "postgresql", "pgsql"})
REDIS_SCHEMES = frozenset({"redis", "rediss", "unix"})
MEMCACHED_PORT = 11211

#: Short timeouts, so that a dead Redis costs a request 0.1 s rather than a hang.
REDIS_OPTIONS = {"SOCKET_CONNECT_TIMEOUT": 0.1, "SOCKET_TIMEOUT": 0.1}


def _error(variable: str, problem: str, example: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{variable}: {problem} (for example {variable}={example})")


def get_bool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """``name`` as a boolean: 1/true/yes/on or 0/false/no/off (any case); unset or blank:
    ``default``."""
    raw = environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise _error(name, f"{raw!r} is not a boolean: use true or false", "false")


def get_list(environ: Mapping[str, str], name: str, default: list[str]) -> list[str]:
    """``name`` as a comma-separated list (blanks dropped); unset or blank: ``default``."""
    items = [item.strip() for item in environ.get(name, "").split(",") if item.strip()]
    return items or list(default)


def _masked(parts: SplitResult) -> str:
    """The URL with its password replaced by ``***`` (for error messages)."""
    if parts.password is None:
        return parts.geturl()
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def _port(parts: SplitResult, variable: str, example: str) -> int | None:
    try:
        return parts.port
    except ValueError:
        raise _error(
            variable, f"the port of {_masked(parts)!r} is not a number from 0 to 65535", example
        ) from None


def state_dir(environ: Mapping[str, str], base_dir: Path) -> Path:
    """``DEMO_STATE_DIR`` (relative to ``base_dir``), default ``base_dir/.demo``; created."""
    path = base_dir / (environ.get("DEMO_STATE_DIR", "").strip() or ".demo")
    path.mkdir(parents=True, exist_ok=True)
    return path


def sqlite_database(path: Path | str) -> dict[str, Any]:
    """A ``DATABASES`` entry for the SQLite file ``path``, tuned for several processes.

    The web server, its flusher thread and the Celery worker all write: WAL lets readers go on
    while one writes, ``IMMEDIATE`` transactions take the write lock up front (a read
    transaction that later writes could otherwise fail at once with "database is locked"),
    and writers wait up to 20 s for each other.
    """
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        "OPTIONS": {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
        },
    }


def parse_database_url(url: str, *, base_dir: Path) -> dict[str, Any]:
    """A ``DATABASES`` entry from ``DATABASE_URL``.

    * ``sqlite:///relative/path.sqlite3`` (relative to ``base_dir``),
      ``sqlite:////absolute/path.sqlite3`` or ``sqlite:///:memory:``;
    * ``postgres://user:password@host:port/name`` (also ``postgresql://``; user, password,
      host and port are optional; percent-escapes are decoded; query parameters such as
      ``?sslmode=require`` become ``OPTIONS``).
    """
    variable, example = "DATABASE_URL", "postgres://demo:secret@127.0.0.1:5432/demo"
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        if parts.netloc:
            raise _error(
                variable,
                f"{_masked(parts)!r} has a host; SQLite URLs have none: three slashes for a "
                "path relative to the project, four for an absolute path",
                "sqlite:////var/lib/demo/db.sqlite3",
            )
        path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        if path in ("", ":memory:"):
            return {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
        return sqlite_database(base_dir / path)
    if scheme in POSTGRES_SCHEMES:
        name = unquote(parts.path.lstrip("/"))
        if not name or "/" in name:
            raise _error(
                variable,
                f"{_masked(parts)!r} names no database (the path after the host)",
                example,
            )
        port = _port(parts, variable, example)
        entry: dict[str, Any] = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            # A socket directory is written percent-escaped: postgres://%2Frun%2Fpostgresql/db
            "HOST": unquote(parts.hostname or ""),
            "PORT": "" if port is None else str(port),
        }
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        if options:
            entry["OPTIONS"] = options
        return entry
    raise _error(
        variable,
        f"unsupported scheme {parts.scheme!r} in {_masked(parts)!r}: use sqlite:// or postgres://",
        example,
    )


def parse_memcached_servers(value: str) -> list[str]:
    """``MEMCACHED_SERVERS``, ``host:port,host:port``, as a ``LOCATION`` list.

    The port defaults to 11211; IPv6 addresses go in brackets (``[::1]:11211``); a Unix
    socket is ``unix:/path/to/socket``.
    """
    variable, example = "MEMCACHED_SERVERS", "127.0.0.1:11211,127.0.0.1:11212"
    servers = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        if item.startswith("unix:"):
            if len(item) == len("unix:"):
                raise _error(
                    variable, f"{item!r} names no socket path", "unix:/run/memcached.sock"
                )
            servers.append(item)
            continue
        if any(c.isspace() for c in item) or "/" in item:
            raise _error(variable, f"{item!r} is not host:port", example)
        parts = urlsplit(f"//{item}")
        try:
            port = parts.port
        except ValueError:
            port = -1
        host = parts.hostname
        if not host or port == -1 or port == 0:
            raise _error(
                variable, f"{item!r} is not host:port with a port from 1 to 65535", example
            )
        shown = f"[{host}]" if ":" in host else host
        servers.append(f"{shown}:{port or MEMCACHED_PORT}")
    return servers


def parse_redis_url(value: str) -> str:
    """``REDIS_URL`` checked: ``redis://[:password@]host[:port][/db]``, ``rediss://`` (TLS) or
    ``unix:///path/to/socket``."""
    variable, example = "REDIS_URL", "redis://127.0.0.1:6379/0"
    url = value.strip()
    parts = urlsplit(url)
    if parts.scheme.lower() not in REDIS_SCHEMES:
        raise _error(
            variable,
            f"{_masked(parts)!r} is not a redis://, rediss:// or unix:// URL",
            example,
        )
    if parts.scheme.lower() == "unix":
        if not parts.path:
            raise _error(variable, f"{url!r} names no socket path", "unix:///run/redis.sock")
        return url
    if not parts.hostname:
        raise _error(variable, f"{_masked(parts)!r} names no host", example)
    _port(parts, variable, example)
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise _error(variable, f"the database of {_masked(parts)!r} is not a number", example)
    return url


def masked_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***`` (to print it)."""
    return _masked(urlsplit(url))


def caches(memcached: list[str], redis_url: str | None) -> dict[str, dict[str, Any]]:
    """``CACHES``: ``default`` (the downsample lock, sessions are in the database) and
    ``ratelimit`` (the counters).

    The counters go to memcached when servers are given, else to Redis, else to local
    memory (each process counts alone: fine for one web process). The default cache goes to
    Redis, else memcached, else local memory.
    """
    local = "django.core.cache.backends.locmem.LocMemCache"
    memcached_cache: dict[str, Any] = {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": memcached,
    }
    redis_cache: dict[str, Any] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": redis_url,
        "OPTIONS": dict(REDIS_OPTIONS),
    }
    default: dict[str, Any]
    ratelimit: dict[str, Any]
    if redis_url:
        default = redis_cache
    elif memcached:
        default = memcached_cache
    else:
        default = {"BACKEND": local, "LOCATION": "bucketry-demo"}
    if memcached:
        ratelimit = memcached_cache
    elif redis_url:
        ratelimit = redis_cache
    else:
        ratelimit = {"BACKEND": local, "LOCATION": "bucketry-demo-ratelimit"}
    return {"default": dict(default), "ratelimit": dict(ratelimit)}


def silenced_checks(cache_settings: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The system checks that warn about local-memory caches, for the caches that are local.

    ``ratelimit_app.W001`` (counters per process) and ``metrics_app.W001`` (a downsample lock
    per process) are expected with the embedded defaults: one web process, one worker.
    """
    local = "django.core.cache.backends.locmem.LocMemCache"
    silenced = []
    if cache_settings["ratelimit"]["BACKEND"] == local:
        silenced.append("ratelimit_app.W001")
    if cache_settings["default"]["BACKEND"] == local:
        silenced.append("metrics_app.W001")
    return silenced


def celery_broker(redis_url: str | None, broker_dir: Path) -> tuple[str, dict[str, Any]]:
    """Celery's broker URL and transport options: Redis when given, else kombu's filesystem
    transport in ``broker_dir`` (created here: the transport needs its folders to exist)."""
    if redis_url:
        return redis_url, {}
    queue, control = broker_dir / "queue", broker_dir / "control"
    for folder in (queue, control):
        folder.mkdir(parents=True, exist_ok=True)
    return "filesystem://localhost//", {
        # One folder both ways: producers (web, beat) and the worker share the queue.
        "data_folder_in": str(queue),
        "data_folder_out": str(queue),
        "control_folder": str(control),
        "store_processed": False,
    }


def secret_key(environ: Mapping[str, str], path: Path) -> str:
    """``SECRET_KEY`` from the environment, else the key kept in ``path``, else a new one
    written there (mode 0600; created exclusively, so two processes starting at once agree).
    """
    given = environ.get("SECRET_KEY", "").strip()
    if given:
        return given
    try:
        stored = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        stored = ""
    if stored:
        return stored
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    # Written whole to a private file first, then linked into place: link() fails if the
    # name exists, so a process starting at the same moment never reads a half-written key.
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(key + "\n")
    try:
        os.link(temporary, path)
    except FileExistsError:  # another process won the race: use its key
        key = path.read_text(encoding="ascii").strip()
    finally:
        temporary.unlink()
    return key

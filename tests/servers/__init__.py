"""Throwaway memcached, Redis and PostgreSQL servers on free loopback ports.

The tests (``tests/conftest.py``'s fixtures) and the benchmarks (``bench/``) both start their
servers here, through the names below; nothing outside this package imports its modules'
other names.

Standard library only: ``make servers`` runs ``python3 -m tests.servers --ensure`` before the
virtualenv exists, and the fixtures import this without Django. One module per concern:

* :mod:`~tests.servers.processes`: free ports, foreground processes started and stopped, the
  :class:`Server` handle, :func:`wait_for`, gunicorn's command line;
* :mod:`~tests.servers.debian`: where each binary is, the Debian package that installs it,
  and ``--ensure``;
* :mod:`~tests.servers.memcached`, :mod:`~tests.servers.redis`,
  :mod:`~tests.servers.postgres`: one server each;
* :mod:`~tests.servers.prometheus`: a Prometheus scraping given targets, and its query API;
* :mod:`~tests.servers.redis_cluster`: three Redis nodes in cluster mode; it needs redis-py,
  so it is imported on its own (``from tests.servers.redis_cluster import Cluster``);
* ``__main__``: the command line.

Each ``start_*`` function picks a free port (bind to port 0, then hand the port to the server;
another process may grab it in between, so a server that dies at start is retried on a new
port), runs the server in a fresh temp dir, waits until it accepts connections and returns a
:class:`Server`. ``stop()`` is idempotent and also registered with :mod:`atexit`, so an
interrupted test run leaves no server behind.

CLI::

    python -m tests.servers memcached|redis|postgres   # start one, print it, wait for Ctrl-C
    python -m tests.servers --ensure                   # install missing Debian packages
"""

from __future__ import annotations

from tests.servers.debian import (
    PACKAGES,
    MissingServerBinary,
    ensure_packages,
    find_binary,
    missing_packages,
    require_binary,
)
from tests.servers.memcached import memcached_argv, start_memcached
from tests.servers.postgres import as_postgres_user, start_postgres
from tests.servers.processes import (
    HOST,
    START_ATTEMPTS,
    Argv,
    Server,
    ServerStartError,
    accepts,
    free_port,
    gunicorn_argv,
    run_checked,
    wait_for,
)
from tests.servers.prometheus import QueryError, active_targets, query, start_prometheus
from tests.servers.redis import redis_argv, start_redis

__all__ = [
    "HOST",
    "PACKAGES",
    "START_ATTEMPTS",
    "Argv",
    "MissingServerBinary",
    "QueryError",
    "Server",
    "ServerStartError",
    "accepts",
    "active_targets",
    "as_postgres_user",
    "ensure_packages",
    "find_binary",
    "free_port",
    "gunicorn_argv",
    "memcached_argv",
    "missing_packages",
    "query",
    "redis_argv",
    "require_binary",
    "run_checked",
    "start_memcached",
    "start_postgres",
    "start_prometheus",
    "start_redis",
    "wait_for",
]

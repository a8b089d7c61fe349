"""A throwaway PostgreSQL cluster in a temp dir on a free loopback port, trust auth."""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

from tests.servers.debian import find_binary, require_binary
from tests.servers.processes import (
    HOST,
    START_ATTEMPTS,
    Server,
    ServerStartError,
    free_port,
    is_root,
    read_tail,
    run_checked,
    user_exists,
)


def as_postgres_user(argv: Sequence[str]) -> list[str]:
    """PostgreSQL refuses to run as root: when we are root, run it as the postgres user."""
    if not is_root():
        return list(argv)
    runuser = shutil.which("runuser")
    if runuser is None or not user_exists("postgres"):
        raise ServerStartError(
            "running as root needs `runuser` (util-linux) and a `postgres` OS user "
            "(created by the Debian package 'postgresql') to start PostgreSQL"
        )
    return [runuser, "-u", "postgres", "--", *argv]


def start_postgres(dbname: str = "bucketry", user: str = "postgres") -> Server:
    """Start a PostgreSQL cluster in a temp dir on a free loopback port, trust auth.

    ``url`` is ``postgresql://postgres@127.0.0.1:PORT/bucketry``; ``extra`` holds
    ``dbname``, ``user`` and ``socket_dir``.
    """
    initdb = require_binary("initdb")
    pg_ctl = require_binary("pg_ctl")
    last_error = ""
    for _attempt in range(START_ATTEMPTS):
        tmpdir = tempfile.mkdtemp(prefix="bucketry-postgres-")
        datadir = os.path.join(tmpdir, "data")
        logfile = os.path.join(tmpdir, "postgres.log")
        if is_root() and user_exists("postgres"):
            entry = pwd.getpwnam("postgres")
            os.chown(tmpdir, entry.pw_uid, entry.pw_gid)
        try:
            run_checked(
                as_postgres_user(
                    [
                        initdb,
                        "-D",
                        datadir,
                        "-U",
                        user,
                        "--auth=trust",
                        "-E",
                        "UTF8",
                        "--no-locale",
                        "--no-sync",
                    ]
                ),
                "initdb",
            )
        except ServerStartError:
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise
        port = free_port()
        # fsync off: a throwaway cluster need not survive a power cut, and tests go faster.
        options = f"-p {port} -k {tmpdir} -c listen_addresses={HOST} -c fsync=off"
        start = [pg_ctl, "-D", datadir, "-l", logfile, "-w", "-t", "30", "-o", options, "start"]
        stop = as_postgres_user([pg_ctl, "-D", datadir, "-m", "fast", "-w", "stop"])
        try:
            run_checked(as_postgres_user(start), "pg_ctl start")
        except ServerStartError as exc:
            # Most likely the port was taken between free_port() and the bind: retry.
            last_error = f"{exc}\n{read_tail(logfile)}"
            subprocess.run(stop, capture_output=True, check=False)
            shutil.rmtree(tmpdir, ignore_errors=True)
            continue

        def stop_cluster(stop: list[str] = stop) -> None:
            subprocess.run(stop, capture_output=True, check=False, timeout=60)

        server = Server(
            name="postgres",
            host=HOST,
            port=port,
            url=f"postgresql://{user}@{HOST}:{port}/{dbname}",
            tmpdir=tmpdir,
            _stop=stop_cluster,
            extra={"dbname": dbname, "user": user, "socket_dir": tmpdir},
        )
        atexit.register(server.stop)
        try:
            createdb = find_binary("createdb")
            if createdb is None:
                raise ServerStartError("createdb not found next to initdb")
            run_checked([createdb, "-h", HOST, "-p", str(port), "-U", user, dbname], "createdb")
        except BaseException:
            server.stop()
            raise
        return server
    raise ServerStartError(
        f"postgres did not start after {START_ATTEMPTS} attempts:\n{last_error}"
    )

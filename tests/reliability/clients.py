"""HTTP clients for the gunicorn tests: processes of threads, standard library only.

:func:`hammer` runs in a child process (``multiprocessing``, spawn): ``threads`` threads send
GETs from ``start`` (wall clock, so every process begins together) until each has sent
``requests`` or ``until`` has passed. Each response is kept as (status, worker pid, end time).
"""

from __future__ import annotations

import http.client
import threading
import time

#: The limit of the site's "one-subject" rule (``site_settings``).
LIMIT = 10


def get(port: int, path: str, timeout: float = 10.0) -> tuple[int, int, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status, int(response.getheader("X-Pid") or 0), time.time()
    except OSError:
        return 0, 0, time.time()  # refused or reset: a worker killed mid-request
    finally:
        conn.close()


def hammer(
    port: int, path: str, threads: int, requests: int, start: float, until: float
) -> list[tuple[int, int, float]]:
    results: list[tuple[int, int, float]] = []
    lock = threading.Lock()

    def run() -> None:
        time.sleep(max(0.0, start - time.time()))
        mine = []
        for _ in range(requests):
            if time.time() > until:
                break
            mine.append(get(port, path))
        with lock:
            results.extend(mine)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=until - time.time() + 60)
    return results

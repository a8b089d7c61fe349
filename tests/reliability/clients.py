"""HTTP clients for the gunicorn tests: processes of threads, standard library only.

:func:`hammer` runs in a child process (``multiprocessing``, spawn): ``threads`` threads send
GETs from ``start`` (wall clock, so every process begins together) until each has sent
``requests`` or ``until`` has passed. Each response is kept as (status, worker pid, end time).
With ``form``, each thread is a :class:`Browser` that first GETs the form's page (before
``start``: its CSRF cookie) and then POSTs the form, every value formatted with a ``{n}``
unique to the request (a site that creates an object per POST wants new usernames).
"""

from __future__ import annotations

import http.client
import os
import threading
import time
from http.cookies import SimpleCookie
from urllib.parse import urlencode

#: The limit of the site's "one-subject" rule (``site_settings``).
LIMIT = 10
#: The site's refusal memory (``site_wsgi`` sets it): how long a worker may go on refusing from
#: memory a subject whose count went down since (a refused hit taken back by another worker).
REFUSAL_MEMORY = 2.0


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


class Browser:
    """One client of a Django site with forms: keeps its cookies, and POSTs the CSRF token of
    its ``csrftoken`` cookie with every form (Django accepts the unmasked secret)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.cookies: dict[str, str] = {}

    def request(
        self, method: str, path: str, form: dict[str, str] | None = None, timeout: float = 30.0
    ) -> tuple[int, str, float]:
        """(status, ``Location`` header, end time); status 0 when the connection failed.

        The timeout is long: a form may hash a password (demo_site's sign-up, about 0.5 s of
        CPU each), and 32 clients queue behind 4 workers on a small machine."""
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())}
        body = None
        if form is not None:
            body = urlencode({**form, "csrfmiddlewaretoken": self.cookies.get("csrftoken", "")})
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body, headers)
            response = conn.getresponse()
            response.read()
            for header in response.msg.get_all("Set-Cookie") or []:
                for name, morsel in SimpleCookie(header).items():
                    self.cookies[name] = morsel.value
            return response.status, response.getheader("Location") or "", time.time()
        except OSError:
            return 0, "", time.time()
        finally:
            conn.close()


def hammer(
    port: int,
    path: str,
    threads: int,
    requests: int,
    start: float,
    until: float,
    form: dict[str, str] | None = None,
) -> list[tuple[int, int, float]]:
    results: list[tuple[int, int, float]] = []
    lock = threading.Lock()

    def run(thread: int) -> None:
        browser = Browser(port)
        if form is not None:
            browser.request("GET", path)
        time.sleep(max(0.0, start - time.time()))
        mine = []
        for i in range(requests):
            if time.time() > until:
                break
            if form is None:
                mine.append(get(port, path))
            else:
                n = f"{os.getpid()}-{thread}-{i}"
                values = {name: value.format(n=n) for name, value in form.items()}
                status, _location, at = browser.request("POST", path, values)
                mine.append((status, 0, at))
        with lock:
            results.extend(mine)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=until - time.time() + 60)
    return results

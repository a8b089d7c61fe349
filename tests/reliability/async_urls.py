"""URLs and async views of the event-loop test's site (settings:
:mod:`tests.reliability.async_settings`). Every view is ``async def``, so under uvicorn each
runs on the event loop:

* ``/plain/`` and ``/probe/``: no limit (no rule covers them);
* ``/decorated/``: ``@ratelimit`` keyed on the ``X-Client`` header, with a rate no client
  reaches: every request is counted, and admitted;
* ``/ruled/``: the same through a middleware rule (``RATELIMIT_RULES``);
* ``/lag/``: how late the event loop was since the last ``/lag/`` (:class:`LoopLag`), as
  JSON (``seconds`` measured, ``ticks``, lateness ``total_s`` and ``max_s``, and
  ``waited_s``: the part of it while the loop's thread ran no code); the count starts again.
"""

from __future__ import annotations

import asyncio
import time

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path

from ratelimit_app.decorators import ratelimit
from tests.reliability.async_settings import HUGE, KEY


class LoopLag:
    """A task on the event loop that sleeps :data:`TICK` seconds, again and again, and adds
    up how late it wakes: time the loop spent on anything but its timers (a blocking call, or
    plain work). Started by the first request (no lifespan needed)."""

    TICK = 0.01

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self.since = time.monotonic()
        self.total = 0.0
        self.most = 0.0
        self.waited = 0.0
        self.ticks = 0

    def ensure(self) -> None:
        if self.task is None:
            self.since = time.monotonic()
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            asleep, cpu = time.monotonic(), time.thread_time()
            await asyncio.sleep(self.TICK)
            late = max(0.0, time.monotonic() - asleep - self.TICK)
            self.total += late
            self.most = max(self.most, late)
            # Late while the loop's thread ran no code (at least): it waited, on a socket, or
            # for the GIL or a CPU.
            self.waited += max(0.0, late - (time.thread_time() - cpu))
            self.ticks += 1

    def read(self) -> dict[str, float]:
        """What was measured since the last read (counting starts again now)."""
        now = time.monotonic()
        numbers = {
            "seconds": round(now - self.since, 4),
            "total_s": round(self.total, 4),
            "max_s": round(self.most, 4),
            "waited_s": round(self.waited, 4),
            "ticks": self.ticks,
        }
        self.since, self.total, self.most, self.waited, self.ticks = now, 0.0, 0.0, 0.0, 0
        return numbers


LAG = LoopLag()


async def plain(request: HttpRequest) -> HttpResponse:
    LAG.ensure()
    return HttpResponse("ok")


@ratelimit(key=KEY, rate=HUGE, block=True)
async def decorated(request: HttpRequest) -> HttpResponse:
    LAG.ensure()
    return HttpResponse("ok")


async def ruled(request: HttpRequest) -> HttpResponse:
    LAG.ensure()
    return HttpResponse("ok")


async def lag(request: HttpRequest) -> JsonResponse:
    LAG.ensure()
    return JsonResponse(LAG.read())


urlpatterns = [
    path("plain/", plain),
    path("probe/", plain),
    path("decorated/", decorated),
    path("ruled/", ruled),
    path("lag/", lag),
]

"""The limiter's work on a body as big as Django reads (2.5 MB), whatever it holds.

A rule keyed on a field of the body (``email``, ``post:<field>``) reads the body before the
view does, and before it knows whether to refuse: a flood of refused requests costs this
work each time, so it must stay a few milliseconds however hostile the body. Each case is a
fresh request (one body, built before the clock starts) whose subject is found for two keys
that read the same field, ``email`` and ``post:email``, as two rules of a login page do.

Columns: ``parse`` is what Django (``request.POST``) or ``json.loads`` costs on the body
alone, which a view that reads the field pays too; ``keys`` is both subjects, parse
included; ``over parse`` is the limiter's own work.

Cases: a form field of U+FDFA (3 bytes of UTF-8, 18 characters once normalised), a JSON
string of it, a JSON object of many small members, a JSON field whose value is a list of
many numbers (its text is what a form field would make of it: ``str()``), a field of ASCII,
an address padded with zero-width spaces or with invisible tags (U+E007F, the slowest
padding to strip).

Run: ``python -m bench.claims.big_bodies [--size BYTES] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.common import configure_django, table

#: Just under Django's DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MiB): the most a view reads.
SIZE = 2_500_000
ROUNDS = 5
KEYS = ("email", "post:email")
ADDRESS = "alice@example.com"


@dataclass(frozen=True)
class Case:
    name: str
    #: The body of ``size`` bytes (about), and its content type.
    body: Callable[[int], tuple[bytes, str]]


def _multipart(value: str) -> tuple[bytes, str]:
    from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart

    return encode_multipart(BOUNDARY, {"email": value}), MULTIPART_CONTENT


def _json(data: object) -> tuple[bytes, str]:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return body.encode(), "application/json"


def _many_members(size: int) -> tuple[bytes, str]:
    # '"k0000001":0,' is 13 bytes: as many members as the body holds, the address last.
    members = {f"k{i:07d}": 0 for i in range((size - 40) // 13)}
    return _json({**members, "email": ADDRESS})


CASES = (
    Case("form, U+FDFA", lambda size: _multipart("\ufdfa" * (size // 3))),
    Case("JSON string, U+FDFA", lambda size: _json({"email": "\ufdfa" * (size // 3)})),
    Case("JSON, many members", _many_members),
    Case("JSON, the field a long list", lambda size: _json({"email": [0] * (size // 2 - 8)})),
    Case("form, ASCII", lambda size: _multipart("a" * size)),
    Case("form, zero-width padding", lambda size: _multipart("\u200b" * (size // 3) + ADDRESS)),
    Case("form, tag padding", lambda size: _multipart("\U000e007f" * (size // 4) + ADDRESS)),
)


@dataclass(frozen=True)
class Row:
    case: str
    body_bytes: int
    parse_ms: float
    keys_ms: float

    @property
    def over_parse_ms(self) -> float:
        return self.keys_ms - self.parse_ms


def _request(body: bytes, content_type: str) -> object:
    from django.test import RequestFactory

    return RequestFactory().generic(
        "POST", "/login/", body, content_type=content_type, REMOTE_ADDR="192.0.2.1"
    )


def _parse(request: object) -> object:
    if request.content_type == "application/json":  # type: ignore[attr-defined]
        return json.loads(request.body)  # type: ignore[attr-defined]
    return request.POST.get("email")  # type: ignore[attr-defined]


def _subjects(request: object) -> object:
    from ratelimit_app.identity import keys

    return [keys.subject(spec, "login", request) for spec in KEYS]  # type: ignore[arg-type]


def _median_ms(
    body: bytes, content_type: str, work: Callable[[object], object], rounds: int
) -> float:
    """The median time of ``work`` on ``rounds`` fresh requests, the garbage collector off
    and what it built kept until the clock stops (its freeing is no part of either)."""
    samples = []
    for _ in range(rounds):
        request = _request(body, content_type)
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            found = work(request)
            samples.append((time.perf_counter() - started) * 1000)
        finally:
            gc.enable()
        del found, request
    return statistics.median(samples)


def run(size: int = SIZE, rounds: int = ROUNDS, cases: Sequence[Case] = CASES) -> list[Row]:
    """One row per case: the median of ``rounds`` fresh requests of a ``size``-byte body."""
    configure_django()
    from django.test import override_settings

    rows = []
    # Bodies up to this size are read, as Django reads them by default.
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=max(size + 4096, 2_621_440)):
        for case in cases:
            body, content_type = case.body(size)
            parse = _median_ms(body, content_type, _parse, rounds)
            found = _median_ms(body, content_type, _subjects, rounds)
            rows.append(Row(case.name, len(body), parse, found))
    return rows


def render(rows: Sequence[Row], rounds: int) -> str:
    title = f"The keys {' and '.join(KEYS)} on one big body (median of {rounds} requests)"
    header = ["case", "body bytes", "parse ms", "keys ms", "over parse ms"]
    body = [
        [r.case, r.body_bytes, f"{r.parse_ms:.1f}", f"{r.keys_ms:.1f}", f"{r.over_parse_ms:.1f}"]
        for r in rows
    ]
    return table(title, header, body)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=SIZE, help="body bytes (about)")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    print(render(run(args.size, args.rounds), args.rounds))


if __name__ == "__main__":
    main()

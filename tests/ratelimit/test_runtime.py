"""One receiver forgets what the settings built (:mod:`ratelimit_app.runtime`).

Each part the limiter keeps in a process is filled, a setting is changed, and when the
runtime is built from that setting every part must be empty (each is built again when next
used), while a setting it is not built from leaves every part as it was.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import RequestFactory, override_settings

from ratelimit_app import backends, conf, runtime, store
from ratelimit_app.config import declared, rules
from ratelimit_app.config.limits import build
from ratelimit_app.engine import check_many
from ratelimit_app.identity import addresses, namespaces, provenance
from ratelimit_app.runtime import RUNTIME

ROOT = Path(__file__).resolve().parents[2]


def fill() -> None:
    """Use each part once, so that it holds something."""
    conf.conf.ENABLE  # noqa: B018  (read: remembered)
    namespaces.namespace("g-runtime", "ip", "192.0.2.1")
    addresses.trusted_proxy("192.0.2.1")
    addresses.mask_ip("192.0.2.1")
    addresses.parse_address("192.0.2.1")
    declared.rules()
    store.current()
    backends.get_backend()
    RUNTIME.part(provenance._csrf_checked)
    RUNTIME.refusals.remember(("runtime",), 0.0, 1e12, None)  # type: ignore[arg-type]
    check = build("g-runtime", "ip", "5/m").check(RequestFactory().get("/"))
    assert check is not None
    check_many([check])
    rules.url_names()[("runtime", None)] = None


def held() -> dict[str, bool]:
    """Which parts hold something now."""
    return {
        "conf": "ENABLE" in vars(conf.conf),
        "namespaces": bool(RUNTIME.namespaces),
        "addresses": bool(RUNTIME.addresses and RUNTIME.masked and RUNTIME.trusted),
        "compiled": bool(RUNTIME.compiled),
        "plans": bool(RUNTIME.plans),
        "declared": declared._rules in RUNTIME.parts,
        "store": RUNTIME.snapshot is not None,
        "backends": bool(RUNTIME.parts.get(backends.Built)),
        "refusals": len(RUNTIME.refusals) > 0,
        "url names": bool(RUNTIME.parts.get(rules._url_names)),
        "csrf": provenance._csrf_checked in RUNTIME.parts,
    }


@pytest.fixture(autouse=True)
def _forgotten_after() -> Iterator[None]:
    yield
    runtime.forget()


EVERYTHING = {
    "conf",
    "namespaces",
    "addresses",
    "compiled",
    "plans",
    "declared",
    "store",
    "backends",
    "refusals",
    "url names",
    "csrf",
}


@pytest.mark.parametrize(
    ("setting", "value", "forgotten"),
    [
        ("RATELIMIT_IPV4_MASK", 24, EVERYTHING),
        ("SECRET_KEY", "another-secret-for-the-runtime-test", EVERYTHING),
        ("ROOT_URLCONF", "tests.urls", EVERYTHING),
        ("LANGUAGE_CODE", "fr", EVERYTHING),
        ("TIME_ZONE", "Europe/Paris", set()),
    ],
)
def test_a_setting_forgets_what_it_built(setting: str, value: object, forgotten: set[str]) -> None:
    fill()
    assert all(held().values()), held()
    with override_settings(**{setting: value}):
        now = held()
    assert {part for part, kept in now.items() if not kept} == forgotten


def test_forget_with_no_setting_forgets_everything() -> None:
    fill()
    runtime.forget()
    assert not any(held().values()), held()


def receivers(package: str) -> list[str]:
    """The functions of ``package`` decorated ``@receiver(setting_changed, ...)``."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for deco in node.decorator_list:
                    if (
                        isinstance(deco, ast.Call)
                        and getattr(deco.func, "id", None) == "receiver"
                        and deco.args
                        and getattr(deco.args[0], "id", None) == "setting_changed"
                    ):
                        found.append(f"{path.relative_to(ROOT)}:{node.name}")
    return found


def test_one_receiver_of_setting_changed() -> None:
    assert receivers("ratelimit_app") == ["ratelimit_app/runtime.py:_settings_changed"]


def test_a_get_usage_call_makes_its_policy_once_and_tells_numbers_types_apart() -> None:
    """``get_usage`` is called with the same arguments on every request: its policy is
    made once (kept in the runtime); a cost of True is refused, never the kept cost of 1;
    a ban's dict cannot be kept and is validated on each call."""
    from ratelimit_app import ALL
    from ratelimit_app.config.limits import LimitError
    from ratelimit_app.config.policy import of_call

    args = ("g-call", "ip", "5/m", ALL, "sliding_window", None)
    first = of_call(*args, 1, None, None, False)
    assert of_call(*args, 1, None, None, False) is first
    assert of_call(*args, 1, None, True, False) is not first  # another policy: fails open
    with pytest.raises(LimitError, match=r"[Cc]ost"):
        of_call(*args, True, None, None, False)
    ban = {"after": 3, "within": "1m", "for": "1h"}
    banning = of_call(*args, 1, ban, None, False)
    again = of_call(*args, 1, ban, None, False)
    assert banning.limit.ban is not None and again.limit.ban == banning.limit.ban
    assert again is not banning  # made again: a dict is no key
    with pytest.raises(LimitError):
        of_call(*args, 1, {"after": "x"}, None, False)

"""One receiver forgets what the settings built (:mod:`ratelimit_app.runtime`).

Each part the limiter keeps in a process is filled, a setting is changed, and the parts that
setting may change must be empty, while the others keep what they hold.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import override_settings

from ratelimit_app import backends, conf, runtime, store
from ratelimit_app.config import declared, rules
from ratelimit_app.engine import memory, sliding_window
from ratelimit_app.identity import addresses, namespaces

ROOT = Path(__file__).resolve().parents[2]


def fill() -> None:
    """Use each part once, so that it holds something."""
    conf.conf.ENABLE  # noqa: B018  (read: remembered)
    namespaces.namespace("g-runtime", "ip", "192.0.2.1")
    addresses.trusted_proxy("192.0.2.1")
    declared.rules()
    store.current()
    backends.get_backend()
    memory.REFUSALS.remember(("runtime",), 0.0, 1e12, None)  # type: ignore[arg-type]
    sliding_window._PREPARED[-1] = None  # type: ignore[assignment]
    rules._names[("runtime", None)] = None


def held() -> dict[str, bool]:
    """Which parts hold something now."""
    return {
        "conf": "ENABLE" in vars(conf.conf),
        "namespaces": bool(namespaces._namespaces),
        "trusted": bool(addresses._trusted),
        "declared": declared.rules.cache_info().currsize > 0,
        "store": store.in_force is not None,
        "backends": bool(backends._backends),
        "refusals": len(memory.REFUSALS) > 0,
        "ready": -1 in sliding_window._PREPARED,
        "url names": bool(rules._names),
    }


LIMITER = {
    "conf",
    "namespaces",
    "trusted",
    "declared",
    "store",
    "backends",
    "refusals",
    "ready",
}


@pytest.fixture(autouse=True)
def _forgotten_after() -> Iterator[None]:
    yield
    runtime.forget()


@pytest.mark.parametrize(
    ("setting", "value", "forgotten"),
    [
        ("RATELIMIT_IPV4_MASK", 24, LIMITER),
        ("SECRET_KEY", "another-secret-for-the-runtime-test", LIMITER),
        ("ROOT_URLCONF", "tests.urls", {"url names"}),
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

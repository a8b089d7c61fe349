"""The limiter's state in a process: one runtime, a few registries, every memo bounded.

Every module of ``ratelimit_app`` is imported and each name it assigns at module level is
looked at: a memo (``lru_cache``, ``cache``), a mutable container (a dict, list, set,
deque, weak collection) or an object of one of the app's classes is state, unless it is a
constant named below with the reason. The state may hold at most 8 objects, each listed in
docs/architecture.rst; no memo is keyed by ``id()``; and one receiver of
``setting_changed`` forgets what the runtime built (at most three in both apps).
"""

from __future__ import annotations

import ast
import collections
import importlib
import pkgutil
import weakref
from pathlib import Path
from typing import Any

import ratelimit_app
from ratelimit_app.runtime import RUNTIME

ROOT = Path(__file__).resolve().parents[1]

#: Module-level objects that are not state, and why.
CONSTANTS = {
    ("ratelimit_app.conf", "conf"): "the runtime's settings (RUNTIME.settings), read fast",
    ("ratelimit_app.config.access", "EMPTY"): "the empty list, never changed",
    ("ratelimit_app.config.rules", "EMPTY"): "the empty rule set, never changed",
    ("ratelimit_app.engine.outcome", "NOTHING"): "the outcome of nothing to do",
    ("ratelimit_app.engine.outcome", "_UNREAD"): "a sentinel",
    ("ratelimit_app", "UNSAFE"): "django-ratelimit's public list of methods",
}
MUTABLE = (
    dict,
    list,
    set,
    collections.deque,
    weakref.WeakSet,
    weakref.WeakKeyDictionary,
    weakref.WeakValueDictionary,
    bytearray,
)
MOST = 9


def _modules() -> list[str]:
    names = ["ratelimit_app"]
    for info in pkgutil.walk_packages(ratelimit_app.__path__, "ratelimit_app."):
        if ".migrations" not in info.name:
            names.append(info.name)
    return names


def _assigned(module: Any) -> set[str]:
    """The names ``module``'s own code assigns or defines at module level."""
    path = getattr(module, "__file__", None)
    if not path:
        return set()
    found = set()
    for node in ast.parse(Path(path).read_text()).body:
        if isinstance(node, ast.Assign):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.value is not None:
                found.add(node.target.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.add(node.name)
    return found


def state() -> dict[str, str]:
    """Every module-level state object of ``ratelimit_app``: ``module.name`` -> what it is."""
    found = {}
    for name in _modules():
        module = importlib.import_module(name)
        for attr in sorted(_assigned(module)):
            if attr == "__all__" or (name, attr) in CONSTANTS:
                continue
            value = getattr(module, attr, None)
            if callable(value) and hasattr(value, "cache_clear"):
                found[f"{name}.{attr}"] = "memo"
            elif isinstance(value, MUTABLE) or (
                type(value).__module__.startswith("ratelimit_app")
                and not isinstance(value, type)
                and not callable(value)
            ):
                found[f"{name}.{attr}"] = type(value).__name__
    return found


def test_the_state_is_one_runtime_and_a_few_registries() -> None:
    found = state()
    assert "ratelimit_app.runtime.RUNTIME" in found
    assert len(found) <= MOST, found


def test_each_state_object_is_listed_in_the_architecture_page() -> None:
    page = (ROOT / "docs" / "architecture.rst").read_text()
    missing = [n for n in state() if f"``{n.removeprefix('ratelimit_app.')}``" not in page]
    assert not missing, missing


def test_the_runtime_memos_are_listed_with_their_bounds() -> None:
    page = (ROOT / "docs" / "architecture.rst").read_text()
    memos = [n for n in RUNTIME.__slots__ if not n.startswith("_")]
    assert [n for n in memos if f"``RUNTIME.{n}``" not in page] == []


def test_a_constant_table_cannot_be_changed() -> None:
    """A table that is no state is read-only (``MappingProxyType``, a tuple, a frozenset):
    the test above would count a dict."""
    from ratelimit_app.config import rules
    from ratelimit_app.identity import keys

    for table in (keys.SIMPLE_KEYS, rules.FIELDS):
        try:
            table["x"] = "y"  # type: ignore[index]
        except TypeError:
            continue
        raise AssertionError(f"{table!r} can be changed")


def _id_keys(path: Path) -> list[int]:
    """Lines of ``path`` where ``id(...)`` keys a subscript, ``.get`` or ``.setdefault``."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        keys: list[ast.AST] = []
        if isinstance(node, ast.Subscript):
            keys = [node.slice]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "setdefault", "pop")
            and node.args
        ):
            keys = [node.args[0]]
        for key in keys:
            for inner in ast.walk(key):
                if (
                    isinstance(inner, ast.Call)
                    and isinstance(inner.func, ast.Name)
                    and inner.func.id == "id"
                ):
                    lines.append(node.lineno)
    return lines


#: Where ``id()`` keys a dictionary that is no memo, and why.
ID_KEYS = {"ratelimit_app/config/views.py": "one request's decorated views, each counted once"}


def test_no_memo_is_keyed_by_id() -> None:
    found = {}
    for path in sorted((ROOT / "ratelimit_app").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        lines = _id_keys(path)
        if lines and rel not in ID_KEYS:
            found[rel] = lines
    assert not found, found


def test_the_count_sees_a_new_memo_and_a_new_container(tmp_path: Path) -> None:
    """The count can fail: a module that keeps a dict and an ``lru_cache`` adds two."""
    import sys

    package = tmp_path / "ratelimit_app_probe.py"
    package.write_text(
        "import functools\n_seen = {}\n@functools.lru_cache\ndef memo(x):\n    return x\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("ratelimit_app_probe")
        assert _assigned(module) >= {"_seen", "memo"}
        assert isinstance(module._seen, MUTABLE) and hasattr(module.memo, "cache_clear")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("ratelimit_app_probe", None)


def test_at_most_three_receivers_of_setting_changed() -> None:
    from tests.ratelimit.test_runtime import receivers

    assert receivers("ratelimit_app") == ["ratelimit_app/runtime.py:_settings_changed"]
    assert len(receivers("ratelimit_app") + receivers("metrics_app")) <= 3

"""The kinds of limit (:mod:`ratelimit_app.config.kinds`): one class per algorithm, listed by
a registry, and nothing else that branches on an algorithm's name."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client, override_settings

from ratelimit_app import store
from ratelimit_app.config import kinds, limits, rules
from ratelimit_app.config.kinds import Kind
from ratelimit_app.engine.step import STEPS
from ratelimit_app.models import Rule

ROOT = Path(__file__).resolve().parents[2]
#: The leaky bucket's own modules: its arithmetic, its engine step and its kind.
LEAKY_BUCKETS_OWN = {
    "ratelimit_app/algorithms/gcra.py",
    "ratelimit_app/engine/leaky_bucket.py",
    "ratelimit_app/config/kinds/leaky_bucket.py",
}
#: The most modules besides those, the backends and the migrations that may name it: the
#: registrations (the kinds' package, the engine's steps) and what a person reads (the
#: commands' help).
MOST_NAMING = 4


def test_the_registry_lists_the_kinds_that_ship() -> None:
    assert list(kinds.KINDS) == ["sliding_window", "in_flight", "leaky_bucket"]
    assert kinds.names() == ("sliding_window", "leaky_bucket")
    assert [(name, str(label)) for name, label in kinds.choices()] == [
        ("sliding_window", "sliding window"),
        ("leaky_bucket", "leaky bucket"),
    ]
    assert kinds.DEFAULT == "sliding_window"
    assert all(isinstance(k, Kind) and k.name == name for name, k in kinds.KINDS.items())
    # Every kind has its step in the engine, and every step is a kind's.
    assert set(STEPS) == set(kinds.KINDS)


def test_a_limit_holds_its_kind() -> None:
    bucket = limits.build("g", "ip", "5/m", algorithm="leaky_bucket", burst=3)
    window = limits.build("g", "ip", "5/m")
    assert bucket.algorithm_kind is kinds.KINDS["leaky_bucket"]
    assert window.algorithm_kind is kinds.KINDS["sliding_window"]
    assert window.inflight is None
    places = limits.build("g", "ip", "5/m", concurrent=2).inflight
    assert places is not None and places.algorithm_kind.holds_places


@pytest.mark.parametrize("name", ["nope", "in_flight", None, 3, ["leaky_bucket"]])
def test_an_unknown_name_is_the_same_mistake_as_ever(name: object) -> None:
    with pytest.raises(limits.LimitError) as caught:
        kinds.kind(name)
    assert caught.value.field == "algorithm"
    assert str(caught.value) == (
        f"Unknown algorithm {name!r}: expected 'sliding_window' (default) or 'leaky_bucket'."
    )


def test_the_messages_that_name_the_kinds_are_as_they_were() -> None:
    assert rules.FIELDS["algorithm"] == "'sliding_window' (default) or 'leaky_bucket'"
    with pytest.raises(limits.LimitError) as caught:
        limits.build("g", "ip", "5/m", burst=3)
    assert str(caught.value) == (
        "Burst 3: a burst is the capacity of a leaky bucket: set the algorithm to "
        "'leaky_bucket', or remove the burst."
    )
    with pytest.raises(limits.LimitError) as caught:
        limits.build("g", "ip", "5/m", algorithm="nope", burst=0)
    assert [e.field for e in caught.value.errors] == ["algorithm", "burst"]


class Toy(Kind):
    """A kind that only a test knows: counts like the sliding window."""

    name = "toy"
    label = "toy kind"

    def described(self, burst: int | None) -> dict[str, object]:
        return {"algorithm": self.name}


@pytest.fixture
def toy() -> Iterator[type[Toy]]:
    kinds.register(Toy)
    try:
        yield Toy
    finally:
        kinds.unregister(Toy.name)


def test_a_kind_registered_is_accepted_and_then_gone(toy: type[Toy]) -> None:
    limit = limits.build("g", "ip", "5/m", algorithm="toy")
    assert isinstance(limit.algorithm_kind, Toy)
    raw = {"name": "t", "path": "/t/", "key": "ip", "rate": "5/m", "algorithm": "toy"}
    compiled = rules.parse_rule(raw)
    assert compiled.describe()["algorithm"] == "toy"
    assert kinds.names() == ("sliding_window", "leaky_bucket", "toy")
    with pytest.raises(limits.LimitError, match=r"\(default\), 'leaky_bucket' or 'toy'\.$"):
        limits.build("g", "ip", "5/m", algorithm="toys")
    kinds.unregister("toy")
    try:
        with pytest.raises(limits.LimitError, match="Unknown algorithm 'toy'"):
            limits.build("g", "ip", "5/m", algorithm="toy")  # not the memoised limit
        assert "toy" not in kinds.KINDS and kinds.names() == ("sliding_window", "leaky_bucket")
    finally:
        kinds.register(Toy)  # (for the fixture to take out)


@pytest.mark.django_db
def test_a_kind_registered_is_an_admin_choice(toy: type[Toy]) -> None:
    field = Rule._meta.get_field("algorithm")
    field.validate("toy", None)
    admin = User.objects.create_superuser("kinds-admin", password="pw")
    client = Client()
    client.force_login(admin)
    with override_settings(ROOT_URLCONF="tests.ratelimit.urls"):
        page = client.get("/admin/ratelimit_app/rule/add/").content.decode()
    assert '<option value="toy">toy kind</option>' in page
    assert '<option value="leaky_bucket">leaky bucket</option>' in page
    rule = Rule(name="toy-rule", path="/t/", key="ip", rate="5/m", algorithm="toy")
    rule.full_clean()  # the model's choices and the rule's validation both take it
    kinds.unregister("toy")
    try:
        with pytest.raises(ValidationError):
            field.validate("toy", None)
        assert ("toy", "toy kind") not in list(field.choices or ())
    finally:
        kinds.register(Toy)
    store.forget()


# What names the leaky bucket in code: an identifier (a name, an attribute, an import, a
# definition, an argument) that says "leaky" or "metered", or a string that holds its name
# as code spells it ("leaky_bucket"). Docstrings and other bare strings, and comments, are
# documentation.
IDENTIFIER = re.compile(r"leaky|metered", re.IGNORECASE)
SPELLED = re.compile(r"leaky_bucket", re.IGNORECASE)


def _words(tree: ast.AST) -> Iterator[tuple[str, re.Pattern[str]]]:
    documentation = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id, IDENTIFIER
        elif isinstance(node, ast.Attribute):
            yield node.attr, IDENTIFIER
        elif isinstance(node, ast.alias):
            yield node.name, IDENTIFIER
            yield node.asname or "", IDENTIFIER
        elif isinstance(node, ast.ImportFrom):
            yield node.module or "", IDENTIFIER
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name, IDENTIFIER
        elif isinstance(node, ast.arg):
            yield node.arg, IDENTIFIER
        elif isinstance(node, ast.keyword):
            yield node.arg or "", IDENTIFIER
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in documentation
        ):
            yield node.value, SPELLED


def names_the_leaky_bucket(source: str) -> bool:
    """Whether the code of ``source`` names the leaky bucket."""
    return any(pattern.search(word) for word, pattern in _words(ast.parse(source)))


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ('"""A leaky bucket (``leaky_bucket``)."""\n# leaky_bucket\nx = 1\n', False),
        ('def f():\n    """leaky_bucket"""\n    return 1\n', False),
        ('MESSAGE = "a leaky bucket takes one rate"\n', False),
        ('if algorithm == "leaky_bucket":\n    pass\n', True),
        ("if limit.algorithm == gcra.LEAKY_BUCKET:\n    pass\n", True),
        ("if limit.metered:\n    pass\n", True),
        ("from ratelimit_app.engine import leaky_bucket\n", True),
        ("from ratelimit_app.engine.leaky_bucket import LeakyBucket as Step\n", True),
        ('HELP = f"--algorithm {name} (e.g. leaky_bucket)"\n', True),
    ],
)
def test_the_count_sees_code_not_documentation(source: str, names: bool) -> None:
    assert names_the_leaky_bucket(source) is names


def test_few_modules_name_the_leaky_bucket() -> None:
    """A new kind of limit is its modules, its encodings in the backends and a registration
    in a few other modules: no module outside the leaky bucket's own branches on it."""
    naming = []
    for path in sorted((ROOT / "ratelimit_app").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if (
            relative in LEAKY_BUCKETS_OWN
            or relative.startswith("ratelimit_app/backends/")
            or "/migrations/" in relative
        ):
            continue
        if names_the_leaky_bucket(path.read_text()):
            naming.append(relative)
    assert len(naming) <= MOST_NAMING, naming

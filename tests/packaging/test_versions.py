"""The versions we claim are the versions we test.

``make test`` runs the suite twice: in .venv on the oldest Python we claim, whose newest
Django is the oldest we claim, and in .venv-newest on the newest Python with the newest
Django the requirement allows. The classifiers name exactly those two pairs, the Django
requirement stops after the newest, and README.md and docs/index.rst say the same.
"""

from __future__ import annotations

import re
import sys

import django
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.packaging.conftest import ROOT, pyproject

Version = tuple[int, int]


def classified(prefix: str) -> list[Version]:
    """The versions named by the classifiers ``prefix :: X.Y``, oldest first."""
    found = []
    for classifier in pyproject()["project"]["classifiers"]:
        head, _, version = classifier.rpartition(" :: ")
        if head == prefix and "." in version:
            major, minor = version.split(".")
            found.append((int(major), int(minor)))
    return sorted(found)


def claimed_pairs() -> list[tuple[Version, Version]]:
    """(Python, Django) for the oldest and the newest leg of ``make test``."""
    pythons = classified("Programming Language :: Python")
    djangos = classified("Framework :: Django")
    assert len(pythons) == len(djangos) == 2, (pythons, djangos)
    return list(zip(pythons, djangos, strict=True))


def dotted(version: Version) -> str:
    return ".".join(map(str, version))


def test_the_metadata_claims_what_make_test_runs() -> None:
    (old_python, old_django), (new_python, new_django) = claimed_pairs()
    project = pyproject()["project"]
    assert project["requires-python"] == f">={dotted(old_python)}"
    (requirement,) = [Requirement(r) for r in project["dependencies"] if r.startswith("Django")]
    next_minor = (new_django[0], new_django[1] + 1)
    assert requirement.specifier == SpecifierSet(f">={dotted(old_django)},<{dotted(next_minor)}")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    newest = re.search(r"^NEWEST_PYTHON\s*\?=\s*(\S+)$", makefile, re.MULTILINE)
    assert newest is not None and newest.group(1) == dotted(new_python)


def test_this_run_is_one_of_the_claimed_pairs() -> None:
    """On Python 3.11 the resolver gives Django 5.2 (6.x needs 3.12), on 3.13 the newest
    the requirement allows; a run on any other pair tests something we do not claim."""
    running = (sys.version_info[:2], django.VERSION[:2])
    assert running in claimed_pairs()


def test_the_readme_and_the_docs_state_the_claimed_pairs() -> None:
    (old_python, old_django), (new_python, new_django) = claimed_pairs()
    lts = " LTS" if old_django[1] == 2 else ""  # Django's x.2 releases are its LTS ones
    sentence = (
        f"Tested on Python {dotted(old_python)} with Django {dotted(old_django)}{lts}, "
        f"and on Python {dotted(new_python)} with Django {dotted(new_django)}."
    )
    for page in ("README.md", "docs/index.rst"):
        text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
        assert sentence in text, page

"""The import paths a project writes keep working where the code has moved into its folder.

The docs (migrating, operators, admin) name these paths; each is the public face of a module
that lives in a folder of its own job (docs/architecture, *The folders*). A face that
re-exports something else than its module, or a module that cannot be imported first in a
fresh process (an import circle the layers' test cannot see at run time), fails here.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.contrib import admin

from tests.test_architecture import ROOT

#: (public path, where it lives) for each documented name.
FACES = [
    ("ratelimit_app.middleware.RatelimitMiddleware", None),
    ("ratelimit_app.decorators.ratelimit", None),
    ("ratelimit_app.core.get_usage", None),
    ("ratelimit_app.core.is_ratelimited", None),
    ("ratelimit_app.throttling.AnonRateThrottle", None),
    ("ratelimit_app.operations.ban", "ratelimit_app.operators.operations.ban"),
    ("ratelimit_app.operations.unban", "ratelimit_app.operators.operations.unban"),
    ("ratelimit_app.operations.reset", "ratelimit_app.operators.operations.reset"),
    ("ratelimit_app.operations.UnknownLimit", "ratelimit_app.operators.operations.UnknownLimit"),
    ("ratelimit_app.keys.client_ip", "ratelimit_app.identity.keys.client_ip"),
    (
        "ratelimit_app.responses.too_many_requests",
        "ratelimit_app.engine.responses.too_many_requests",
    ),
]


def _get(path: str) -> object:
    from django.utils.module_loading import import_string

    return import_string(path)


@pytest.mark.parametrize(("public", "home"), FACES)
def test_a_documented_path_is_the_object_of_its_home(public: str, home: str | None) -> None:
    found = _get(public)
    assert found is not None
    if home is not None:
        assert found is _get(home)


def test_the_admins_face_registers_the_operators_pages() -> None:
    from ratelimit_app import admin as face
    from ratelimit_app.models import Ban, Override, Rule

    assert face.admin.__name__ == "ratelimit_app.operators.admin"
    for model in (Rule, Ban, Override):
        assert admin.site.is_registered(model)


#: The modules that moved into a folder of their own job, and the faces left at the top:
#: each must import first, alone, in a fresh process.
FIRST = [
    "ratelimit_app.config.bans",
    "ratelimit_app.config.versions",
    "ratelimit_app.bans.held",
    "ratelimit_app.bans.applied",
    "ratelimit_app.engine.refusals.memory",
    "ratelimit_app.engine.refusals.remembered",
    "ratelimit_app.engine.refusals.recall",
    "ratelimit_app.store",
    "ratelimit_app.operations",
    "ratelimit_app.operators.telemetry",
]


def test_each_moved_module_imports_first_in_a_fresh_process() -> None:
    """Each module imported before anything else of ours (and before Django's set-up, which
    would import them all): a package's face that imports its modules makes a circle at run
    time that the layers' test, reading imports module by module, cannot see."""
    for name in FIRST:
        alone = f"import importlib\nimportlib.import_module({name!r})\n"
        done = subprocess.run(
            [sys.executable, "-c", alone],
            cwd=ROOT,
            env={"DJANGO_SETTINGS_MODULE": "tests.settings", "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, (name, done.stderr[-2000:])

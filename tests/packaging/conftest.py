"""The package as PyPI would get it: the sdist and wheel that ``python -m build`` makes.

``python -m build`` builds the sdist from this tree and then the wheel from that sdist, as
a user's pip would from PyPI, so a file the sdist forgets breaks the wheel too. ``project``
is a ``startproject`` project set up as README.md says, in a venv holding that wheel, made
once for the session: tests that need a different project change a copy of it.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ratelimit_app", "metrics_app")


def pyproject() -> dict[str, Any]:
    """pyproject.toml, parsed."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def outcome(argv: Sequence[str | Path], cwd: Path) -> tuple[int, str]:
    """Run a command to completion, away from this checkout's settings and paths: its exit
    status and its output (stdout and stderr together)."""
    done = subprocess.run(
        [str(arg) for arg in argv],
        cwd=cwd,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        check=False,
    )
    return done.returncode, done.stdout


def run(argv: Sequence[str | Path], cwd: Path) -> str:
    """:func:`outcome`'s output, or a failure that shows it when the command failed."""
    status, output = outcome(argv, cwd)
    if status != 0:
        pytest.fail(f"{' '.join(map(str, argv))} exited {status}:\n{output}")
    return output


def clean_env() -> dict[str, str]:
    """This environment without what points Python at this checkout or its settings."""
    env = dict(os.environ)
    for name in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(name, None)
    return env


@dataclass(frozen=True)
class Dists:
    wheel: Path
    sdist: Path


@pytest.fixture(scope="session")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    """The sdist and wheel of this tree, built once for the session."""
    out = tmp_path_factory.mktemp("dist")
    # uv (the dev group's) makes build's isolated environment in a second, not pip's ten.
    build = [sys.executable, "-m", "build", "--installer=uv"]
    # The sdist's egg-info is written in this tree: `make test` runs two legs at once, and
    # the lock (on pyproject.toml, which every checkout has) keeps their builds apart.
    with (ROOT / "pyproject.toml").open("rb") as tree:
        fcntl.flock(tree, fcntl.LOCK_EX)
        run([*build, "--outdir", out, ROOT], cwd=ROOT)
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return Dists(wheel=wheel, sdist=sdist)


def readme_install_blocks() -> tuple[str, str]:
    """The Install section's settings blocks (joined) and view block."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    install = readme.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    # The blocks a reader copies in turn (a list item's block is an alternative, indented).
    blocks = re.findall(r"^```python\n(.*?)^```", install, re.DOTALL | re.MULTILINE)
    settings = "\n".join(block for block in blocks if "def " not in block)
    (view,) = [block for block in blocks if "def " in block]
    assert all(name in settings for name in ("CACHES", "MIDDLEWARE", "RATELIMIT_RULES"))
    return settings, view


def settings_from_readme(memcached: str) -> str:
    """The README's settings as lines appended to a startproject settings.py.

    Its lists leave Django's own entries to "...": our apps go after them, and each
    middleware after the one the README puts before it.
    """
    namespace: dict[str, Any] = {}
    exec(readme_install_blocks()[0], namespace)
    caches = namespace["CACHES"]
    assert caches["default"]["BACKEND"].endswith("PyMemcacheCache")
    caches["default"]["LOCATION"] = memcached
    middleware = namespace["MIDDLEWARE"]
    return textwrap.dedent(
        f"""

        # README.md's Install section
        CACHES = {caches!r}
        RATELIMIT_RULES = {namespace["RATELIMIT_RULES"]!r}
        INSTALLED_APPS += {namespace["INSTALLED_APPS"]!r}
        for before, name in zip({middleware!r}, {middleware[1:]!r}):
            MIDDLEWARE.insert(MIDDLEWARE.index(before) + 1, name)
        """
    )


@dataclass(frozen=True)
class Project:
    """A ``startproject`` project (its manage.py in ``path``) and the venv it runs in."""

    path: Path
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin/python"

    def manage(self, *args: str) -> list[str | Path]:
        """The argv of ``manage.py args``, warnings as errors: a deprecation of ours would
        show on a user's console."""
        return [self.python, "-W", "error", "manage.py", *args]


@pytest.fixture(scope="session")
def venv(tmp_path_factory: pytest.TempPathFactory, dists: Dists) -> Path:
    """A new venv with the wheel and its ``memcached`` extra, as a user would install it
    (pip fetching Django and pymemcache as for a user, from its cache when it can)."""
    path = tmp_path_factory.mktemp("site") / "venv"
    run([sys.executable, "-m", "venv", path], cwd=path.parent)
    run(
        [path / "bin/python", "-m", "pip", "install", "--quiet", f"{dists.wheel}[memcached]"],
        cwd=path.parent,
    )
    return path


@pytest.fixture(scope="session")
def project(venv: Path, memcached_server: str) -> Project:
    """``django-admin startproject proj`` with the README's settings (the cache the
    session's memcached), its view at ``/hello/``, and its tables migrated."""
    home = venv.parent
    run([venv / "bin/django-admin", "startproject", "proj"], cwd=home)
    made = Project(path=home / "proj", venv=venv)
    with (made.path / "proj/settings.py").open("a", encoding="utf-8") as f:
        f.write(settings_from_readme(memcached_server))
    (made.path / "proj/views.py").write_text(readme_install_blocks()[1], encoding="utf-8")
    with (made.path / "proj/urls.py").open("a", encoding="utf-8") as f:
        f.write('\nfrom proj import views\n\nurlpatterns += [path("hello/", views.hello)]\n')
    run(made.manage("migrate", "--no-input"), cwd=made.path)
    return made

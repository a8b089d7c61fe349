"""The package as PyPI would get it: the sdist and wheel that ``python -m build`` makes.

``python -m build`` builds the sdist from this tree and then the wheel from that sdist, as
a user's pip would from PyPI, so a file the sdist forgets breaks the wheel too.
"""

from __future__ import annotations

import os
import subprocess
import sys
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


def run(argv: Sequence[str | Path], cwd: Path) -> str:
    """Run a command to completion, away from this checkout's settings and paths; its
    output, or a failure that shows it."""
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
    if done.returncode != 0:
        pytest.fail(f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout}")
    return done.stdout


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
    argv = [sys.executable, "-m", "build", "--installer=uv", "--outdir", out, ROOT]
    run(argv, cwd=ROOT)
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return Dists(wheel=wheel, sdist=sdist)

"""``make demo`` installs what the demo runs; ``make test`` adds the tools to the same .venv.

The demo's install is the public extras the Makefile names plus pyproject's ``demo`` group;
the tools are the ``dev`` group, which includes ``demo``. ``make -n`` against a virtualenv
that does not exist shows each target's install commands without running them.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.packaging.conftest import ROOT, pyproject

FIRST_PARTY = {"demo_site", "ratelimit_app", "metrics_app"}


def names(requirements: list[str | dict[str, str]]) -> set[str]:
    """The distribution names of a requirement list (a group's includes left out)."""
    return {canonicalize_name(Requirement(r).name) for r in requirements if isinstance(r, str)}


def makefile_extras() -> str:
    """The extras the Makefile installs, as its EXTRAS spells them (``memcached,redis``)."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    found = re.search(r"^EXTRAS\s*:=\s*(\S+)$", makefile, re.MULTILINE)
    assert found is not None
    return found.group(1)


def demo_install() -> set[str]:
    """Every distribution ``make demo`` asks pip for by name."""
    metadata = pyproject()
    project = metadata["project"]
    wanted = names(project["dependencies"]) | names(metadata["dependency-groups"]["demo"])
    for extra in makefile_extras().split(","):
        wanted |= names(project["optional-dependencies"][extra])
    return wanted


def planned(target: str, tmp_path: Path) -> str:
    """The commands ``make <target>`` would run for a fresh .venv (none is run)."""
    done = subprocess.run(
        ["make", "-n", target, f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_make_demo_installs_the_demo_group_and_no_tools(tmp_path: Path) -> None:
    commands = planned("demo", tmp_path)
    assert f"pip install --quiet -e '.[{makefile_extras()}]' --group demo\n" in commands
    assert "--group dev" not in commands


def test_make_test_adds_the_tools_and_stamps_the_demo_install_too(tmp_path: Path) -> None:
    commands = planned("test", tmp_path)
    assert "--group dev" in commands
    assert re.search(r"^touch \S+/\.installed \S+/\.demo-installed$", commands, re.MULTILINE)


def test_the_demo_installs_none_of_the_tools() -> None:
    dev = pyproject()["dependency-groups"]["dev"]
    assert {"include-group": "demo"} in dev
    tools = names(dev)
    assert {"playwright", "mypy", "sphinx", "ruff", "django-ratelimit"} <= tools
    assert not tools & demo_install()


def imported_modules(folder: Path) -> set[str]:
    """The top-level modules that the Python files under ``folder`` import."""
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


def test_every_module_the_demo_imports_is_in_its_install() -> None:
    modules = imported_modules(ROOT / "demo_site")
    third_party = modules - set(sys.stdlib_module_names) - FIRST_PARTY
    assert {"django", "celery", "rest_framework"} <= third_party
    distributions = packages_distributions()
    wanted = demo_install()
    for module in sorted(third_party):
        provided = {canonicalize_name(d) for d in distributions.get(module, [])}
        assert provided & wanted, f"demo_site imports {module}, which make demo does not install"

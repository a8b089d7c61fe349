"""The wheel installed as a user installs it, into a new project set up as README.md says.

A throwaway venv gets the wheel (not an editable install) with the ``memcached`` extra, pip
fetching Django and pymemcache as for a user (from its cache when it can).
``django-admin startproject`` makes the project; the settings and the view are the README's
own code blocks, the cache the session's real memcached. Then ``migrate``, ``check``, and
requests through Django's test client until the decorated view answers 429, and wrong
passwords on the admin's log-in until the README's rules answer 429.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.packaging.conftest import ROOT, Dists, run


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


# Run by the project's manage.py shell: the README's view, six times from one address, then
# six wrong passwords on the admin's log-in (the README's rules allow five a minute).
REQUESTS = """
import json

from django.test import Client
from django.test.utils import setup_test_environment

import metrics_app
import ratelimit_app

setup_test_environment()  # "testserver" becomes an allowed host
client = Client()
responses = [client.get("/hello/") for _ in range(6)]
login = {"username": "admin", "password": "wrong"}
logins = [client.post("/admin/login/", login) for _ in range(6)]
metrics_app.flush()
print(json.dumps({
    "codes": [r.status_code for r in responses],
    "retry_after": responses[-1].headers.get("Retry-After"),
    "logins": [r.status_code for r in logins],
    "login_retry_after": logins[-1].headers.get("Retry-After"),
    "counted": metrics_app.query.total("hello"),
    "package": ratelimit_app.__file__,
}))
"""


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, dists: Dists) -> Path:
    """A new venv with the wheel and its ``memcached`` extra, as a user would install it."""
    path = tmp_path_factory.mktemp("site") / "venv"
    run([sys.executable, "-m", "venv", path], cwd=path.parent)
    run(
        [path / "bin/python", "-m", "pip", "install", "--quiet", f"{dists.wheel}[memcached]"],
        cwd=path.parent,
    )
    return path


def test_a_new_project_gets_429_from_the_readme_view(venv: Path, memcached_server: str) -> None:
    python = venv / "bin/python"
    home = venv.parent
    run([venv / "bin/django-admin", "startproject", "proj"], cwd=home)
    project = home / "proj"
    with (project / "proj/settings.py").open("a", encoding="utf-8") as f:
        f.write(settings_from_readme(memcached_server))
    (project / "proj/views.py").write_text(readme_install_blocks()[1], encoding="utf-8")
    with (project / "proj/urls.py").open("a", encoding="utf-8") as f:
        f.write('\nfrom proj import views\n\nurlpatterns += [path("hello/", views.hello)]\n')

    # Warnings are errors here too: a deprecation of ours would show on a user's console.
    manage: list[str | Path] = [python, "-W", "error", "manage.py"]
    run([*manage, "migrate", "--no-input"], cwd=project)
    checked = run([*manage, "check"], cwd=project)
    assert checked.strip() == "System check identified no issues (0 silenced)."
    out = run([*manage, "shell", "--no-startup", "-c", REQUESTS], cwd=project)
    result = json.loads(out.strip().splitlines()[-1])

    assert result["codes"] == [200] * 5 + [429]  # rate="5/m;100/d"
    assert int(result["retry_after"]) > 0
    assert result["logins"] == [200] * 5 + [429]  # the form again for a wrong password
    assert int(result["login_retry_after"]) > 0
    assert result["counted"] == 5  # @count_visits under @ratelimit: refusals not counted
    # The wheel's code answered, not this checkout's.
    assert Path(result["package"]).is_relative_to(venv)


def test_the_quickstart_shows_the_rules_the_readme_tested() -> None:
    """docs/quickstart.rst's rules are the README's, which the test above takes to a 429."""
    namespace: dict[str, Any] = {}
    exec(readme_install_blocks()[0], namespace)
    page = (ROOT / "docs" / "quickstart.rst").read_text(encoding="utf-8")
    block = page.split("   RATELIMIT_RULES = ", 1)[1].split("\n   ]\n", 1)[0] + "]"
    assert ast.literal_eval(block) == namespace["RATELIMIT_RULES"]

"""The wheel installed as a user installs it, into a new project set up as README.md says.

The ``project`` fixture (tests/packaging/conftest.py) puts the wheel (not an editable
install) with the ``memcached`` extra in a throwaway venv, makes the project with
``django-admin startproject``, appends the README's own code blocks to it (the cache the
session's real memcached) and migrates. Then ``check``, and requests through Django's test
client until the decorated view answers 429, and wrong passwords on the admin's log-in until
the README's rules answer 429.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from tests.packaging.conftest import ROOT, Project, readme_install_blocks, run

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


def test_a_new_project_gets_429_from_the_readme_view(project: Project) -> None:
    checked = run(project.manage("check"), cwd=project.path)
    assert checked.strip() == "System check identified no issues (0 silenced)."
    shell = project.manage("shell", "--no-startup", "-c", REQUESTS)
    result = json.loads(run(shell, cwd=project.path).strip().splitlines()[-1])

    assert result["codes"] == [200] * 5 + [429]  # rate="5/m;100/d"
    assert int(result["retry_after"]) > 0
    assert result["logins"] == [200] * 5 + [429]  # the form again for a wrong password
    assert int(result["login_retry_after"]) > 0
    assert result["counted"] == 5  # @count_visits under @ratelimit: refusals not counted
    # The wheel's code answered, not this checkout's.
    assert Path(result["package"]).is_relative_to(project.venv)


def test_the_quickstart_shows_the_rules_the_readme_tested() -> None:
    """docs/quickstart.rst's rules are the README's, which the test above takes to a 429."""
    namespace: dict[str, Any] = {}
    exec(readme_install_blocks()[0], namespace)
    page = (ROOT / "docs" / "quickstart.rst").read_text(encoding="utf-8")
    block = page.split("   RATELIMIT_RULES = ", 1)[1].split("\n   ]\n", 1)[0] + "]"
    assert ast.literal_eval(block) == namespace["RATELIMIT_RULES"]

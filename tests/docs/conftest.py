"""What the snippets' pages assume a reader has: the modules they tell the reader to write
(``myproject/ratelimit_keys.py``, ``myproject/authentication.py``), importable as printed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.snippets import snippet

#: Where a block holding a module then settings starts its settings.
SETTINGS_MARK = "# settings.py\n"


def module_and_settings(code: str) -> tuple[str, str]:
    """A block that shows a module, then ``# settings.py`` and what goes there."""
    module, mark, settings = code.partition(SETTINGS_MARK)
    assert mark, "the block no longer marks its settings part"
    return module, settings


@pytest.fixture
def myproject(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package ``myproject`` on the path with the modules the pages print: the log-in
    rules' key (docs/rules.rst) and the DRF authentication (docs/drf.rst)."""
    package = tmp_path / "myproject"
    package.mkdir()
    (package / "__init__.py").write_text("")
    keys = snippet("rules", 7, "# myproject/ratelimit_keys.py", "def account_and_address")
    (package / "ratelimit_keys.py").write_text(keys.code)
    auth = snippet("drf", 1, "# myproject/authentication.py", "class BasicAuthenticationOnPost")
    (package / "authentication.py").write_text(module_and_settings(auth.code)[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    import sys

    for name in [n for n in sys.modules if n == "myproject" or n.startswith("myproject.")]:
        del sys.modules[name]

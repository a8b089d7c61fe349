"""Sphinx configuration for django-bucketry. Build with `make docs` (warnings are errors)."""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# For autodoc. Importing models also needs `django.setup()` here: add it with the first
# automodule of a module that needs the app registry, not before, so the docs build does not
# depend on every app importing cleanly.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

with (ROOT / "pyproject.toml").open("rb") as fh:
    release = tomllib.load(fh)["project"]["version"]
version = ".".join(release.split(".")[:2])

project = "django-bucketry"
author = "django-bucketry contributors"
copyright = "django-bucketry contributors"

extensions = ["sphinx.ext.autodoc"]
autodoc_typehints = "description"
autodoc_member_order = "bysource"

exclude_patterns = ["_build"]
default_role = "code"
nitpicky = False

html_theme = "alabaster"
html_theme_options = {
    "description": "Rate limits and traffic metrics on multi-level time buckets",
    "fixed_sidebar": True,
}
html_sidebars = {"**": ["about.html", "navigation.html", "searchbox.html"]}

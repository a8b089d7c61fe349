"""What the wheel and the sdist carry, and the metadata PyPI shows."""

from __future__ import annotations

import email.message
import email.parser
import tarfile
import zipfile
from pathlib import Path

from tests.packaging.conftest import PACKAGES, ROOT, Dists


def package_files() -> set[str]:
    """Every file of our packages in this tree: code, migrations, templates, py.typed."""
    return {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(zf.read(name).decode())


def test_the_wheel_carries_every_file_of_the_packages_and_the_license(dists: Dists) -> None:
    """Migrations, templates, translations and py.typed included: a package-data pattern
    that misses a file (a new template folder, say) would leave it out of every install.
    MIT asks that the notice ship with every copy."""
    with zipfile.ZipFile(dists.wheel) as zf:
        names = set(zf.namelist())
        (license_name,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        license_text = zf.read(license_name).decode()
    shipped = {n for n in names if n.split("/", 1)[0] in PACKAGES}
    assert shipped == package_files()
    assert {f"{package}/py.typed" for package in PACKAGES} <= shipped
    assert "ratelimit_app/migrations/0001_initial.py" in shipped
    assert "metrics_app/migrations/0001_initial.py" in shipped
    assert "ratelimit_app/templates/ratelimit_app/429.html" in shipped
    for language in ("fr", "de", "es"):  # the translations, compiled as Django reads them
        assert f"ratelimit_app/locale/{language}/LC_MESSAGES/django.mo" in shipped
    assert license_text == (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert license_text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the django-bucketry developers" in license_text


def test_the_sdist_carries_the_notices_and_no_tests(dists: Dists) -> None:
    """LICENSE and CHANGELOG ship; the tests do not, since they need the whole checkout
    (demo site, docs, bench, servers) to run (MANIFEST.in)."""
    with tarfile.open(dists.sdist) as tf:
        names = {name.split("/", 1)[1] for name in tf.getnames() if "/" in name}
        license_text = tf.extractfile(f"{dists.sdist.name[: -len('.tar.gz')]}/LICENSE")
        assert license_text is not None
        assert license_text.read().decode() == (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "PKG-INFO"} <= names
    assert package_files() <= names
    assert not [name for name in names if name.startswith(("tests/", "bench/", "docs/"))]


def test_the_metadata_pypi_shows(dists: Dists) -> None:
    meta = wheel_metadata(dists.wheel)
    assert meta["License-Expression"] == "MIT"
    urls = dict(value.split(", ", 1) for value in meta.get_all("Project-URL", []))
    assert urls == {
        "Documentation": "https://django-bucketry.readthedocs.io/",
        "Source": "https://github.com/django-bucketry/django-bucketry",
        "Issues": "https://github.com/django-bucketry/django-bucketry/issues",
        "Changelog": "https://github.com/django-bucketry/django-bucketry/blob/main/CHANGELOG.md",
    }
    # The tools of a clone are a dependency group, never an extra a user can ask for.
    assert set(meta.get_all("Provides-Extra", [])) == {
        "memcached",
        "redis",
        "celery",
        "drf",
        "prometheus",
        "otel",
    }
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload() == (ROOT / "README.md").read_text(encoding="utf-8")

"""README.md is PyPI's project page: every link must work from there."""

from __future__ import annotations

import re

from docutils.nodes import make_id

from tests.packaging.conftest import ROOT

DOCS = "https://django-bucketry.readthedocs.io/en/latest/"
SOURCE = "https://github.com/django-bucketry/django-bucketry/blob/main/"


def readme_links() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"\]\(([^)\s]+)\)", text)


def page_ids(page: str) -> set[str]:
    """The HTML ids Sphinx gives a page's labels and section titles."""
    text = (ROOT / "docs" / f"{page}.rst").read_text(encoding="utf-8")
    labels = re.findall(r"^\.\. _([^:]+):$", text, re.MULTILINE)
    titles = re.findall(r"^(.+)\n([=\-~^\"'`]){3,}$", text, re.MULTILINE)
    return {make_id(label) for label in labels} | {make_id(t.strip("`")) for t, _ in titles}


def test_the_readme_has_no_relative_links() -> None:
    links = readme_links()
    assert len(links) > 15
    assert [link for link in links if not link.startswith("https://")] == []


def test_every_readme_link_names_a_page_or_file_that_exists() -> None:
    for link in readme_links():
        if link.startswith(DOCS):
            page, _, anchor = link.removeprefix(DOCS).partition("#")
            assert page.endswith(".html"), link
            page = page.removesuffix(".html")
            assert (ROOT / "docs" / f"{page}.rst").is_file(), link
            assert not anchor or anchor in page_ids(page), link
        elif link.startswith(SOURCE):
            assert (ROOT / link.removeprefix(SOURCE)).is_file(), link
        else:
            raise AssertionError(f"a link to neither the docs nor the source: {link}")

"""The 429, 403 and 503 answers in the client's language, and the catalogs that ship.

A project picks the language as Django does: ``LANGUAGE_CODE``, or ``LocaleMiddleware`` from
``Accept-Language``. French, German and Spanish ship in ``ratelimit_app/locale``; the tests
below keep every message of them translated and their compiled ``.mo`` files in step.
"""

from __future__ import annotations

import gettext
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.cache import caches
from django.core.management import call_command
from django.test import Client, override_settings
from django.utils import translation

from ratelimit_app.backends import reset_backends
from ratelimit_app.testing import forget_refusals, frozen_clock
from tests.ratelimit.conftest import MIDDLEWARE, rules
from tests.translations import read_po

T0 = 1_800_000_000.0
LOCALE = Path(__file__).resolve().parents[2] / "ratelimit_app" / "locale"
LANGUAGES = ("fr", "de", "es")
#: Each language's LocaleMiddleware, as a project adds it: after the session, before us.
LOCALE_MIDDLEWARE = [MIDDLEWARE[0], "django.middleware.locale.LocaleMiddleware", *MIDDLEWARE[1:]]

#: language: (page heading, "Please wait" sentence, JSON title, JSON detail).
EXPECTED = {
    "fr": (
        "Ralentissez",
        "Veuillez patienter {n} secondes, puis réessayez.",
        "Trop de requêtes",
        "Cette requête dépasse la limite 1/m de la règle 'page'. Réessayez dans {n} secondes.",
    ),
    "de": (
        "Langsamer, bitte",
        "Bitte warten Sie {n} Sekunden und versuchen Sie es dann erneut.",
        "Zu viele Anfragen",
        "Diese Anfrage überschreitet das Limit 1/m der Regel 'page'. "
        "Versuchen Sie es in {n} Sekunden erneut.",
    ),
    "es": (
        "Más despacio",
        "Espere {n} segundos y vuelva a intentarlo.",
        "Demasiadas solicitudes",
        "Esta solicitud supera el límite 1/m de la regla 'page'. "
        "Inténtelo de nuevo dentro de {n} segundos.",
    ),
    "en": (
        "Slow down",
        "Please wait {n} seconds and try again.",
        "Too Many Requests",
        "This request exceeds the limit 1/m of rule 'page'. Try again in {n} seconds.",
    ),
}


@pytest.fixture(autouse=True)
def site(rules_site: None) -> Iterator[None]:
    caches["default"].clear()
    yield
    caches["default"].clear()


def page_rule(**fields: Any) -> dict[str, Any]:
    return {"name": "page", "path": "/rules/named/", "key": "ip", "rate": "1/m", **fields}


def refused(client: Client, **headers: Any) -> tuple[str, dict[str, Any]]:
    """The 429 page and the 429 JSON problem of a rule whose limit the first request used."""
    with frozen_clock(T0):
        assert client.get("/rules/named/", **headers).status_code == 200
        page = client.get("/rules/named/", **headers)
        problem = client.get("/rules/named/", HTTP_ACCEPT="application/json", **headers)
    assert page.status_code == problem.status_code == 429
    return page.content.decode(), problem.json()


def assert_in(language: str, page: str, problem: dict[str, Any]) -> None:
    n = problem["retry_after"]
    assert n > 1  # a plural
    heading, wait, title, detail = (text.format(n=n) for text in EXPECTED[language])
    assert f'<html lang="{language}">' in page
    assert f"<h1>{heading}</h1>" in page and wait in " ".join(page.split())
    assert (problem["title"], problem["detail"]) == (title, detail)


@pytest.mark.parametrize("language", LANGUAGES)
def test_language_code_translates_the_429_page_and_detail(client: Client, language: str) -> None:
    with rules(page_rule(), LANGUAGE_CODE=language):
        page, problem = refused(client)
    assert_in(language, page, problem)
    assert "Too many" not in page and "Please wait" not in page


@pytest.mark.parametrize("language", LANGUAGES)
def test_accept_language_picks_the_language_through_locale_middleware(
    client: Client, language: str
) -> None:
    with rules(page_rule(), MIDDLEWARE=LOCALE_MIDDLEWARE):
        page, problem = refused(client, HTTP_ACCEPT_LANGUAGE=f"{language},en;q=0.5")
    assert_in(language, page, problem)


def test_english_by_default(client: Client) -> None:
    with rules(page_rule(), MIDDLEWARE=LOCALE_MIDDLEWARE):
        page, problem = refused(client)
    assert_in("en", page, problem)
    assert "Too many requests came from your network address in a short time." in page


def test_the_pages_kept_for_a_flood_are_kept_per_language(client: Client) -> None:
    """Italian ships no catalog, so its page has the English page's context: the page kept
    for it must not be served to the next English client, nor the other way round."""
    with rules(page_rule(), MIDDLEWARE=LOCALE_MIDDLEWARE):
        italian, _ = refused(client, HTTP_ACCEPT_LANGUAGE="it")
        caches["default"].clear()
        forget_refusals()
        english, _ = refused(client)
    assert '<html lang="it">' in italian and '<html lang="en">' in english


def test_a_decorated_view_and_the_deny_list_answer_in_german(client: Client) -> None:
    with override_settings(MIDDLEWARE=LOCALE_MIDDLEWARE, LANGUAGE_CODE="de"):
        with frozen_clock(T0):
            assert [client.get("/blocking/").status_code for _ in range(4)][-1] == 429
            page = client.get("/blocking/").content.decode()
        assert "Von Ihrer Netzwerkadresse kamen in kurzer Zeit zu viele Anfragen." in page
        with rules(RATELIMIT_DENY=["203.0.113.9"]):
            denied = client.get(
                "/rules/unnamed/", REMOTE_ADDR="203.0.113.9", HTTP_ACCEPT="application/json"
            )
    assert denied.status_code == 403
    assert denied.json()["title"] == "Verboten"
    assert denied.json()["detail"] == "Anfragen dieses Clients werden nicht angenommen."


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def counters_down() -> Iterator[None]:
    """The counters on a memcached address where nothing listens."""
    dead = {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": f"127.0.0.1:{dead_port()}",
    }
    with override_settings(CACHES={**settings.CACHES, "rl": dead}, RATELIMIT_USE_CACHE="rl"):
        reset_backends()
        yield
    reset_backends()


@pytest.mark.usefixtures("counters_down")
def test_the_fail_closed_answer_is_translated(client: Client) -> None:
    with rules(page_rule(fail_open=False), MIDDLEWARE=LOCALE_MIDDLEWARE):
        answer = client.get(
            "/rules/named/", HTTP_ACCEPT="application/json", HTTP_ACCEPT_LANGUAGE="es"
        )
        page = client.get("/rules/named/", HTTP_ACCEPT_LANGUAGE="fr")
        english = client.get("/rules/named/", HTTP_ACCEPT="application/json")
    assert answer.status_code == page.status_code == 503
    assert answer.json()["title"] == "Servicio no disponible"
    assert answer.json()["detail"] == (
        "El límite de frecuencia de la regla 'page' no se puede comprobar en este momento. "
        "Inténtelo de nuevo dentro de 5 segundos."
    )
    assert "Service indisponible" in page.content.decode()
    assert english.json()["detail"] == (
        "The rate limit of rule 'page' cannot be checked right now. Try again in 5 seconds."
    )


def test_one_second_is_singular() -> None:
    from ratelimit_app.engine import responses

    with translation.override("fr"):
        assert responses.try_again(1) == "Réessayez dans 1 seconde."
    with translation.override("es"):
        assert responses.try_again(1) == "Inténtelo de nuevo dentro de 1 segundo."
    assert responses.try_again(1) == "Try again in 1 second."


def test_the_drf_fail_closed_message_is_translated() -> None:
    from ratelimit_app.throttling.throttles import ThrottleUnavailable

    with translation.override("de"):
        detail = str(ThrottleUnavailable("burst").detail)
    assert detail == (
        "Die Ratenbegrenzung 'burst' kann gerade nicht geprüft werden. "
        "Versuchen Sie es in 5 Sekunden erneut."
    )


# The catalogs.


@pytest.mark.parametrize("language", LANGUAGES)
def test_every_message_is_translated_and_compiled(language: str) -> None:
    folder = LOCALE / language / "LC_MESSAGES"
    po, fuzzy = read_po(folder / "django.po")
    assert not fuzzy
    assert len(po) > 50
    assert [key for key, text in po.items() if not text] == []
    assert f"Language: {language}\\n" in po[""].replace("\n", "\\n")
    with (folder / "django.mo").open("rb") as f:
        compiled = gettext.GNUTranslations(f)
    # The .mo holds exactly what the .po says: compilemessages was run after the last edit.
    # (msgfmt leaves the POT-Creation-Date out of the header.)
    assert {**compiled._catalog, "": ""} == {**po, "": ""}  # type: ignore[attr-defined]


@pytest.mark.skipif(shutil.which("xgettext") is None, reason="GNU gettext is not installed")
def test_the_catalogs_hold_every_message_of_the_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message added to the code without a new makemessages would reach every client
    in English: makemessages run on a copy of the app must find no message the shipped
    catalog lacks, nor leave one it has."""
    shipped, _ = read_po(LOCALE / "fr" / "LC_MESSAGES" / "django.po")
    app = tmp_path / "ratelimit_app"
    shutil.copytree(LOCALE.parent, app, ignore=shutil.ignore_patterns("__pycache__", "*.mo"))
    monkeypatch.chdir(app)
    call_command("makemessages", locale=["fr"], no_obsolete=True, verbosity=0)
    fresh, _ = read_po(app / "locale" / "fr" / "LC_MESSAGES" / "django.po")
    assert set(fresh) == set(shipped)

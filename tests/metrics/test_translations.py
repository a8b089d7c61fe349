"""The metrics admin in the site's language, and the catalogs that ship.

French, German and Spanish ship in ``metrics_app/locale``, as ``ratelimit_app``'s do for the
429. A project picks the language as Django does (``LANGUAGE_CODE``, or ``LocaleMiddleware``);
the admin pages a superuser sees (the series list and a series' chart page) then read in it.
The tests below also keep every message of the code in the catalogs, translated and compiled.
"""

from __future__ import annotations

import gettext
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.test.utils import override_settings
from django.urls import reverse
from django.utils import translation

import metrics_app
from metrics_app import charts
from metrics_app.models import Series
from metrics_app.testing import FrozenClock
from tests.translations import read_po

LOCALE = Path(metrics_app.__file__).resolve().parent / "locale"
LANGUAGES = ("fr", "de", "es")

#: language: words of the list page, then of the chart page (zoomed into 11:00 UTC of T0).
EXPECTED = {
    "fr": (
        ["Dernières 24 h", "Activité, dernières 24 h", "au cours des 24 dernières heures"],
        [
            "Première apparition",
            "Activité",
            "24 heures",
            "Zoomer sur une heure (UTC)",
            "événements sur 11:00\N{EN DASH}12:00 UTC le 6 mars",
            "par intervalles de 1 minute",
        ],
    ),
    "de": (
        ["Letzte 24 h", "Aktivität, letzte 24 h", "in den letzten 24 Stunden"],
        [
            "Zuerst gesehen",
            "Aktivität",
            "24 Stunden",
            "Auf eine Stunde zoomen (UTC)",
            "Ereignisse in 11:00\N{EN DASH}12:00 UTC am 6. März",
            "Intervalle zu je 1 Minute",
        ],
    ),
    "es": (
        ["Últimas 24 h", "Actividad, últimas 24 h", "en las últimas 24 horas"],
        [
            "Visto por primera vez",
            "Actividad",
            "24 horas",
            "Ampliar una hora (UTC)",
            "eventos en 11:00\N{EN DASH}12:00 UTC del 6 mar",
            "en intervalos de 1 minuto",
        ],
    ),
}
#: What the English pages say where the translated ones say the words above.
ENGLISH = (
    ["Last 24 h", "Activity, last 24 h", "in the last 24 hours"],
    [
        "First seen",
        "Activity",
        "24 hours",
        "Zoom into an hour (UTC)",
        "events in 11:00\N{EN DASH}12:00 UTC, Mar 6",
        "in buckets of 1 minute",
    ],
)


@pytest.fixture
def admin_client_of_series(clock: FrozenClock, django_user_model: Any) -> tuple[Client, Series]:
    """A superuser's client, and a series with events in the last two hours (as of T0)."""
    for k in range(12):
        metrics_app.record("shop:home", 3, at=clock.t - 600 * (k + 1))
    metrics_app.flush()
    client = Client()
    client.force_login(django_user_model.objects.create_superuser("root", "r@example.com", "pw"))
    return client, Series.objects.get(name="shop:home")


def pages(client: Client, series: Series) -> tuple[str, str]:
    """The series list, and the series' chart page zoomed into the hour before T0."""
    listing = client.get(reverse("admin:metrics_app_series_changelist"))
    change = reverse("admin:metrics_app_series_change", args=[series.pk])
    chart = client.get(f"{change}?period=24h&zoom=2024-03-06T11:00")
    assert listing.status_code == chart.status_code == 200
    return " ".join(listing.content.decode().split()), " ".join(chart.content.decode().split())


@pytest.mark.django_db
@pytest.mark.parametrize("language", LANGUAGES)
def test_the_admin_pages_read_in_the_site_language(
    admin_client_of_series: tuple[Client, Series], language: str
) -> None:
    with override_settings(LANGUAGE_CODE=language):
        listing, chart = pages(*admin_client_of_series)
    list_words, chart_words = EXPECTED[language]
    assert f'lang="{language}"' in listing
    assert [w for w in list_words if w not in listing] == []
    assert [w for w in chart_words if w not in chart] == []
    # And none of the English is left.
    assert [w for w in ENGLISH[0] if w in listing] == []
    assert [w for w in ENGLISH[1] if w in chart] == []


@pytest.mark.django_db
def test_english_by_default(admin_client_of_series: tuple[Client, Series]) -> None:
    listing, chart = pages(*admin_client_of_series)
    assert [w for w in ENGLISH[0] if w not in listing] == []
    assert [w for w in ENGLISH[1] if w not in chart] == []


def test_the_chart_words_follow_the_active_language() -> None:
    """What metrics_app.charts draws, outside a request: steps, the day, the empty chart."""
    day = datetime(2024, 3, 6, tzinfo=UTC)
    with translation.override("fr"):
        assert [charts.describe_step(s) for s in (1, 600, 7200, 604800)] == [
            "1 seconde",
            "10 minutes",
            "2 heures",
            "1 semaine",
        ]
        assert charts.short_day(day) == "6 mars"
        assert charts.short_day(day + timedelta(days=260)) == "21 nov."
        assert "Aucune donnée" in charts.bar_chart([], 60, title="t")
    with translation.override("de"):
        assert charts.describe_step(2 * 86400) == "2 Tage"
        assert charts.short_day(day) == "6. März"
    with translation.override("es"):
        assert charts.describe_step(60) == "1 minuto"
        assert charts.short_day(day + timedelta(days=60)) == "5 may"
    assert charts.describe_step(2 * 86400) == "2 days"
    assert charts.short_day(day) == "Mar 6"


# The catalogs.


@pytest.mark.parametrize("language", LANGUAGES)
def test_every_message_is_translated_and_compiled(language: str) -> None:
    folder = LOCALE / language / "LC_MESSAGES"
    po, fuzzy = read_po(folder / "django.po")
    assert not fuzzy
    assert "Last 24 h" not in po and "last 24 h" in po  # the msgid the admin capitalises
    assert [key for key, text in po.items() if not text] == []
    assert f"Language: {language}\\n" in po[""].replace("\n", "\\n")
    with (folder / "django.mo").open("rb") as f:
        compiled = gettext.GNUTranslations(f)
    # The .mo holds exactly what the .po says: compilemessages was run after the last edit.
    assert {**compiled._catalog, "": ""} == {**po, "": ""}  # type: ignore[attr-defined]


@pytest.mark.skipif(shutil.which("xgettext") is None, reason="GNU gettext is not installed")
@pytest.mark.parametrize("language", LANGUAGES)
def test_the_catalogs_hold_every_message_of_the_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, language: str
) -> None:
    """A message added to the code or a template without a new makemessages would reach
    every operator in English: makemessages run on a copy of the app must find no message
    the shipped catalog lacks, nor leave one it has."""
    shipped, _ = read_po(LOCALE / language / "LC_MESSAGES" / "django.po")
    app = tmp_path / "metrics_app"
    shutil.copytree(LOCALE.parent, app, ignore=shutil.ignore_patterns("__pycache__", "*.mo"))
    monkeypatch.chdir(app)
    call_command("makemessages", locale=[language], no_obsolete=True, verbosity=0)
    fresh, _ = read_po(app / "locale" / language / "LC_MESSAGES" / "django.po")
    assert set(fresh) == set(shipped)


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_message_both_apps_hold_reads_the_same_in_both(language: str) -> None:
    """Django merges the apps' catalogs, the first installed app's translation winning: a
    message (``"count"``, ``"expires"``) translated two ways would show ratelimit_app's word
    in the metrics admin, so the catalogs must agree."""
    ours, _ = read_po(LOCALE / language / "LC_MESSAGES" / "django.po")
    ratelimit_locale = LOCALE.parents[1] / "ratelimit_app" / "locale"
    theirs, _ = read_po(ratelimit_locale / language / "LC_MESSAGES" / "django.po")
    shared = (set(ours) & set(theirs)) - {""}
    assert "count" in shared
    assert {key: (ours[key], theirs[key]) for key in shared if ours[key] != theirs[key]} == {}

"""``RATELIMIT_TELEMETRY``: which sinks get the instruments, of both apps. Under ``"auto"``
never both under the same names in one scrape: with OpenTelemetry's Prometheus exporter
installed, prometheus-client's instruments alone are made (docs/observability.rst)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from metrics_app import telemetry as metrics_telemetry
from ratelimit_app.conf import read
from ratelimit_app.operators import telemetry

PROM, OTEL, BRIDGE = "prometheus_client", "opentelemetry.metrics", telemetry.OTEL_TO_PROMETHEUS
MODULES = (PROM, OTEL, BRIDGE)


def having(*modules: str) -> Callable[[str], bool]:
    return lambda module: module in modules


@pytest.mark.parametrize(
    ("value", "modules", "sinks"),
    [
        ("auto", (PROM, OTEL), ("prometheus", "otel")),  # two destinations: both
        ("auto", (PROM, OTEL, BRIDGE), ("prometheus",)),  # one scrape: prometheus-client's
        ("auto", (OTEL, BRIDGE), ("otel",)),
        ("auto", (PROM,), ("prometheus",)),
        ("auto", (), ()),
        ("prometheus", (PROM, OTEL, BRIDGE), ("prometheus",)),
        ("otel", (PROM, OTEL, BRIDGE), ("otel",)),
        ("both", (PROM, OTEL, BRIDGE), ("prometheus", "otel")),
        ("off", (PROM, OTEL), ()),
    ],
)
def test_the_setting_chooses_the_sinks(
    value: str, modules: tuple[str, ...], sinks: tuple[str, ...]
) -> None:
    assert telemetry.chosen(value, having(*modules)) == sinks


@pytest.mark.parametrize("value", ["Prometheus", "opentelemetry", "", None, True, ["otel"]])
def test_a_bad_value_is_named(value: object) -> None:
    with pytest.raises(ImproperlyConfigured) as caught:
        telemetry.chosen(value, having(*MODULES))
    assert f"RATELIMIT_TELEMETRY = {value!r}" in str(caught.value)
    assert "'auto', 'prometheus', 'otel', 'both', 'off'" in str(caught.value)


@pytest.mark.parametrize(
    ("value", "missing", "extra"),
    [("prometheus", PROM, "prometheus"), ("otel", OTEL, "otel"), ("both", OTEL, "otel")],
)
def test_a_sink_named_but_not_installed_names_its_extra(
    value: str, missing: str, extra: str
) -> None:
    with pytest.raises(ImproperlyConfigured, match=rf"django-bucketry\[{extra}\]"):
        telemetry.chosen(value, having(*(m for m in MODULES if m != missing)))


def test_both_apps_choose_alike() -> None:
    """The metrics app reads the same setting (it never imports ratelimit_app)."""
    assert metrics_telemetry.CHOICES == telemetry.CHOICES
    for value in (*telemetry.CHOICES, "bad"):
        for n in range(len(MODULES) + 1):
            for modules in itertools.combinations(MODULES, n):
                found = []
                for chosen in (telemetry.chosen, metrics_telemetry.chosen):
                    try:
                        found.append(chosen(value, having(*modules)))
                    except ImproperlyConfigured as exc:
                        found.append(str(exc))
                assert found[0] == found[1], (value, modules)


def test_the_default_is_auto_and_read_from_settings() -> None:
    with override_settings():
        del settings.RATELIMIT_TELEMETRY  # tests/settings.py chooses "both"
        assert read("RATELIMIT_TELEMETRY") == "auto"
    with override_settings(RATELIMIT_TELEMETRY="off"):
        assert telemetry.chosen(read("RATELIMIT_TELEMETRY")) == ()
    # The dev venv has both libraries and OpenTelemetry's Prometheus exporter: "auto"
    # makes prometheus-client's instruments alone.
    assert telemetry.chosen("auto") == ("prometheus",)

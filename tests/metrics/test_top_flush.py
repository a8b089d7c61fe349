"""Top keys (:func:`metrics_app.record_top`) written with the flush: added up per bucket,
bounded per name and bucket, expired, and lost (logged) rather than kept when a write fails."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.test.utils import override_settings

import metrics_app
from metrics_app import buffer, rollup
from metrics_app.models import TopKey
from metrics_app.storage import TOP_BUCKET
from metrics_app.testing import FrozenClock
from metrics_app.topk import CAPACITY
from tests.metrics.conftest import T0

pytestmark = [pytest.mark.db_matrix, pytest.mark.django_db]

DAY = 86400.0


def rows(name: str = "logins") -> dict[str, TopKey]:
    return {r.key: r for r in TopKey.objects.filter(name=name)}


def test_a_flush_writes_the_top_keys_and_the_next_adds_to_them(clock: FrozenClock) -> None:
    for _ in range(3):
        metrics_app.record_top("logins", "{a}", "203.0.113.0/24", "", keep=DAY)
    clock.advance(2)
    metrics_app.record_top("logins", "{b}", "alice", "5", keep=DAY)
    metrics_app.flush()
    found = rows()
    assert {k: r.count for k, r in found.items()} == {"{a}": 3, "{b}": 1}
    a = found["{a}"]
    assert (a.label, a.ref, a.start % TOP_BUCKET) == ("203.0.113.0/24", "", 0)
    assert a.first_seen == a.last_seen == T0
    assert a.expires == a.last_seen + timedelta(days=1)
    assert found["{b}"].ref == "5"

    clock.advance(3)
    metrics_app.record_top("logins", "{a}", "203.0.113.0/24", "", keep=DAY)
    metrics_app.flush()
    a = rows()["{a}"]
    assert a.count == 4
    assert a.last_seen - a.first_seen == timedelta(seconds=5)
    assert buffer.current().tops.size() == 0  # the flush took them


def test_each_name_and_bucket_keeps_its_most_counted_keys(clock: FrozenClock) -> None:
    for flush in range(3):  # each flush a new crowd of keys in the same bucket
        for i in range(CAPACITY):
            metrics_app.record_top("logins", f"{{{flush}-{i}}}", keep=DAY)
        metrics_app.flush()
    for _ in range(5):
        metrics_app.record_top("logins", "{heavy}", keep=DAY)
    metrics_app.flush()
    kept = rows()
    assert len(kept) == CAPACITY
    assert kept["{heavy}"].count == 5


def test_rows_expire_at_a_flush_and_in_the_downsample(clock: FrozenClock) -> None:
    metrics_app.record_top("logins", "{old}", keep=60)
    metrics_app.record_top("other", "{old}", keep=60)
    metrics_app.flush()
    clock.advance(120)
    metrics_app.record_top("logins", "{new}", keep=60)
    metrics_app.flush()
    assert set(rows()) == {"{new}"}
    assert TopKey.objects.filter(name="other").count() == 0
    metrics_app.record_top("other", "{x}", keep=60)
    metrics_app.flush()
    clock.advance(120)
    rollup.downsample()
    assert TopKey.objects.count() == 0


def test_long_labels_are_cut_and_long_refs_dropped(clock: FrozenClock) -> None:
    metrics_app.record_top("logins", "{k}", "é" * 500, "x" * 321, keep=DAY)
    metrics_app.flush()
    row = rows()["{k}"]
    assert (row.label, row.ref) == ("é" * 200, "")


def test_a_bad_name_is_refused_before_anything_is_kept() -> None:
    with pytest.raises(ValueError, match="1 to 200 characters"):
        metrics_app.record_top("x" * 201, "{k}", keep=DAY)
    with pytest.raises(ValueError, match="NUL"):
        metrics_app.record_top("bad\x00name", "{k}", keep=DAY)
    assert buffer.current().tops.size() == 0


class Nowhere:
    """A database router that sends every write to an alias no database has."""

    def db_for_write(self, model: type, **hints: object) -> str:
        return "nowhere"


def test_a_failed_write_loses_the_top_keys_and_says_so(
    clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    metrics_app.record_top("logins", "{k}", keep=DAY)
    with override_settings(DATABASE_ROUTERS=[Nowhere()]), caplog.at_level(logging.WARNING):
        assert metrics_app.flush(raise_errors=False) == 0
    assert "1 top keys lost" in caplog.text
    assert buffer.current().tops.size() == 0  # memory stays bounded
    metrics_app.flush()
    assert TopKey.objects.count() == 0

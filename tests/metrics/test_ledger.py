"""The flush ledger's horizon (``rollup.LEDGER_DAYS``): what the downsample prunes, and that
a batch retried inside the horizon is still not counted twice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import OperationalError

import metrics_app
from metrics_app import buffer, rollup, storage
from metrics_app.models import FlushLedger
from metrics_app.query import total
from metrics_app.testing import FrozenClock
from tests.metrics.conftest import lose_first_commit_reply

pytestmark = [pytest.mark.db_matrix, pytest.mark.django_db]

DAY = 86400


def ledger() -> set[str]:
    return set(FlushLedger.objects.values_list("flush_id", flat=True))


@pytest.mark.parametrize("days", [7, 2, 0.5])
def test_entries_older_than_the_horizon_are_pruned_younger_kept(
    clock: FrozenClock, days: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written a second past the horizon: pruned; at the horizon and a second inside: kept."""
    now = clock.t
    horizon = days * DAY
    for flush_id, age in [("past", horizon + 1), ("at", horizon), ("inside", horizon - 1)]:
        clock.set(now - age)
        assert storage.write_counts({("a", int(clock.t // 60)): 1}, flush_id)
    clock.set(now)
    if days != 7:  # the constant
        monkeypatch.setattr(rollup, "LEDGER_DAYS", days)
    result = rollup.downsample()
    assert result.ledger_pruned == 1
    assert ledger() == {"at", "inside"}
    created = FlushLedger.objects.get(flush_id="at").created
    assert created == datetime.fromtimestamp(now, tz=UTC) - timedelta(days=days)


def test_a_downsample_of_one_series_prunes_nothing(clock: FrozenClock) -> None:
    """Read-triggered runs (one series) leave the ledger to the periodic run."""
    storage.write_counts({("a", int(clock.t // 60)): 1}, "old")
    clock.advance(30 * DAY)
    metrics_app.record("a")
    metrics_app.flush()
    assert rollup.downsample(series_names=["a"]).ledger_pruned == 0
    assert "old" in ledger()


@pytest.mark.parametrize("days", [7, 1])
def test_a_retry_inside_the_horizon_is_not_counted_twice_even_after_a_downsample(
    clock: FrozenClock, monkeypatch: pytest.MonkeyPatch, days: int
) -> None:
    """The database is away for the horizon less a minute, with downsamples meanwhile: the
    batch whose COMMIT reply was lost is retried and still recognised."""
    calls = lose_first_commit_reply(monkeypatch)
    metrics_app.record("a", 7)
    with pytest.raises(OperationalError):
        metrics_app.flush()
    monkeypatch.setattr(rollup, "LEDGER_DAYS", days)
    for _ in range(days):  # a run a day, the last one a minute before the horizon
        clock.advance(DAY - 60 if _ == days - 1 else DAY)
        assert rollup.downsample().ledger_pruned == 0
    metrics_app.record("a", 1)
    assert metrics_app.flush() == 1
    assert calls[0] == calls[1]  # the same batch, retried
    assert total("a") == 8
    assert buffer.stats()["pending_batches"] == 0


def test_past_the_horizon_the_entry_is_gone(
    clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other side of the same boundary: a day past ``LEDGER_DAYS = 1`` the
    entry is pruned, so the table does not grow without end (and a batch retried only then
    would be applied again, as docs/metrics.rst says)."""
    metrics_app.record("a", 7)
    metrics_app.flush()
    (flush_id,) = ledger()
    monkeypatch.setattr(rollup, "LEDGER_DAYS", 1)
    clock.advance(DAY - 1)
    assert rollup.downsample().ledger_pruned == 0
    clock.advance(2)
    assert rollup.downsample().ledger_pruned == 1
    assert flush_id not in ledger()
    assert storage.write_counts({("a", int(clock.t // 60)): 7}, flush_id) is True
    assert total("a") == 14

"""KV integrity and pool quarantine: read through the API's models (tolerant of an older
controller that sends neither) and the console's wording."""

from __future__ import annotations

import time

import pytest

from controller.fleet.guard import Quarantine as ControllerQuarantine
from controller.models import Role
from dashboard import integrity
from pdctl_api.schema import ClusterPublic, KvIntegrityPublic, QuarantinePublic, StatsPublic
from tests.dashboard.fake import FakeController, integrity_summary


def stats_of(fake: FakeController) -> StatsPublic:
    c = fake.client()
    try:
        return c.stats(60)
    finally:
        c.close()


def test_kv_integrity_is_read_from_the_stats() -> None:
    fake = FakeController(kv_integrity=integrity_summary(after_in_window=3,
                                                         expired_in_window=2, suspect=4))
    assert stats_of(fake).kv_integrity == KvIntegrityPublic(
        expired_requests=12.0, notifications_after_expiry=4.0, expired_in_window=2.0,
        after_expiry_in_window=3.0, suspect_requests=4, alert=True)


def test_kv_integrity_absent_is_none() -> None:
    assert stats_of(FakeController(legacy=True)).kv_integrity is None


def test_alert_text_only_when_alerting() -> None:
    quiet = KvIntegrityPublic(notifications_after_expiry=5, after_expiry_in_window=1)
    assert integrity.alert_text(quiet, 60) is None
    text = integrity.alert_text(KvIntegrityPublic(notifications_after_expiry=5,
                                                  after_expiry_in_window=1,
                                                  suspect_requests=1, alert=True), 60)
    assert text is not None
    assert "1 read of freed KV blocks in the last 60 s" in text
    assert "1 request record is marked suspect" in text and "5 such reads in total" in text
    assert "HTTP 200" in text and "may be wrong" in text
    assert "docs/routing-and-accounting.md" in text and "vLLM's KV contract" in text


def test_expired_text_only_with_expiries_in_the_window() -> None:
    assert integrity.expired_text(KvIntegrityPublic(expired_requests=9), 60) is None
    text = integrity.expired_text(KvIntegrityPublic(expired_requests=9, expired_in_window=1),
                                  60)
    assert text is not None and text.startswith("1 finished prefill in the last 60 s")
    assert "9 in total" in text and "`kv.expired`" in text


def test_quarantine_text() -> None:
    q = QuarantinePublic(remaining_s=61.2, crashes=4,
                         last_error="process exited with status -4 (SIGILL)")
    text = integrity.quarantine_text(Role.PREFILL, q)
    assert text.startswith("**Prefill pool quarantined** after 4 crashes")
    assert "no new prefill instance starts for another 1 min 2 s" in text
    assert "`process exited with status -4 (SIGILL)`" in text


def test_quarantined_pools_of_the_cluster() -> None:
    fake = FakeController()
    assert integrity.quarantined(ClusterPublic.model_validate(fake.cluster())) == {}
    fake.quarantine[Role.PREFILL] = ControllerQuarantine(time.time() + 30, 3, "boom")
    found = integrity.quarantined(ClusterPublic.model_validate(fake.cluster()))
    assert list(found) == [Role.PREFILL] and found[Role.PREFILL].crashes == 3
    fake.legacy = True  # an older controller does not send the field
    assert integrity.quarantined(ClusterPublic.model_validate(fake.cluster())) == {}


@pytest.mark.parametrize(("seconds", "shown"), [(0, "0 s"), (4.2, "5 s"), (59.5, "1 min"),
                                                 (65, "1 min 5 s"), (600, "10 min"),
                                                 (-3, "0 s")])
def test_fmt_duration(seconds: float, shown: str) -> None:
    assert integrity.fmt_duration(seconds) == shown

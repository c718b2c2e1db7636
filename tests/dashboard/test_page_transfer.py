"""The Transfer page: the reads-of-freed-KV alert, suspect requests and the KV lease
counters per prefill instance."""

from __future__ import annotations

from tests.dashboard.fake import FakeController, integrity_summary, make_instances
from tests.dashboard.page_helpers import Console, frame_with, no_exceptions, texts


def test_transfer_page_shows_the_kv_alert_too(console: Console, fake: FakeController) -> None:
    fake.kv_integrity = integrity_summary(after_in_window=1, suspect=1)
    at = console(fake, "transfer")
    alert = texts(at.error)
    assert "1 read of freed KV blocks" in alert and "1 request record is marked suspect" in alert


def test_transfer_page_lists_suspect_requests(console: Console, fake: FakeController) -> None:
    fake.records[-5].suspect = True
    at = console(fake, "transfer")
    no_exceptions(at)
    table = frame_with(at, "suspect")
    assert list(table["id"]) == ["req-295"] and list(table["suspect"]) == ["⚠ suspect"]
    assert "1 suspect of the last 300 requests" in texts(at.markdown)


def test_transfer_page_shows_lease_counters_per_prefill(console: Console,
                                                        fake: FakeController) -> None:
    fake.instances = make_instances(2, 3)
    fake.instances[1].kv_expired, fake.instances[1].kv_after_expiry = 7.0, 2.0
    at = console(fake, "transfer")
    no_exceptions(at)
    table = frame_with(at, "notifications_after_expiry")
    assert list(table["id"]) == ["prefill-1", "prefill-2"]
    assert list(table["kv_expired_requests"]) == [0.0, 7.0]
    assert list(table["notifications_after_expiry"]) == [0.0, 2.0]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Suspect requests"] == "0"


def test_kv_handles_per_prefill_instance_come_from_the_records(console: Console,
                                                                fake: FakeController) -> None:
    """The engines count NIXL transfers on the decode side, so a prefill instance's own
    counter is always 0; the table counts the KV handles each prefill produced instead."""
    fake.instances = make_instances(2, 1)
    at = console(fake, "transfer")
    no_exceptions(at)
    table = frame_with(at, "notifications_after_expiry")
    assert list(table["id"]) == ["prefill-1", "prefill-2"]
    # The 300 records in the window (2 in 3 disaggregated, all on prefill-1), read once for
    # the page (its 500 newest).
    assert list(table["kv_handles"]) == [200.0, 0.0]
    assert "KV handles: of the 300 newest requests in the range" in texts(at.caption)

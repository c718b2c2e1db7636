"""The Pools page: every instance, a quarantined pool, and an instance opened: its requests
(their TTFT p50 the Overview's), its drain after review."""

from __future__ import annotations

import re

from tests.dashboard.fake import FakeController, make_instances, make_records
from tests.dashboard.page_helpers import Console, by_label, no_exceptions, quarantine_decode, texts


def test_pools_page_lists_every_instance(console: Console, fake: FakeController) -> None:
    fake.instances = make_instances(40, 80)
    at = console(fake, "pools")
    table = at.dataframe[0].value
    assert len(table) == 120
    assert set(table["role"]) == {"prefill", "decode"}
    assert "120 of 120 instances" in texts(at.caption)


def test_an_instance_opens_with_its_requests_and_drains_after_review(
        console: Console, fake: FakeController) -> None:
    fake.instances = make_instances(1, 2)  # prefill-1, decode-2, decode-3 (no request)
    at = console(fake, "pools")
    by_label(at.selectbox, "instance").set_value("decode-2").run()
    no_exceptions(at)
    assert "**Its requests**" in texts(at.markdown)
    assert by_label(at.metric, "Requests").value == "300"  # every fake request's decode hop
    assert "engine log line of decode-2" in texts(at.code)
    by_label(at.button, "Review drain (restart)").click().run()
    assert "drain decode-2" in texts(at.warning) and fake.changes() == []  # reviewed, not sent
    by_label(at.button, "Confirm change").click().run()
    no_exceptions(at)
    assert fake.changes() == [("POST", "/api/v1/instances/decode-2/drain", None)]
    by_label(at.selectbox, "instance").set_value("decode-3").run()
    assert "No request went through decode-3" in texts(at.info)


def test_a_viewer_opens_an_instance_and_is_offered_no_drain(console: Console,
                                                            fake: FakeController) -> None:
    fake.viewer = True
    at = console(fake, "pools")
    by_label(at.selectbox, "instance").set_value("prefill-1").run()
    no_exceptions(at)
    assert by_label(at.metric, "Requests").value == "200"
    assert not [b for b in at.button if b.label.startswith("Review drain")]


def test_pools_page_shows_the_quarantine(console: Console, fake: FakeController) -> None:
    quarantine_decode(fake)
    at = console(fake, "pools")
    no_exceptions(at)
    assert len(at.error) == 1
    box = at.error[0].value
    assert "Decode pool quarantined" in box and "3 crashes" in box
    assert re.search(r"for another 1 min( \d+ s)?\.", box)  # 95 s, less the test's time
    assert "Last error: `process exited with status -4 (SIGILL)`" in box
    assert "quarantined" in texts(at.markdown)


def test_pools_page_has_no_quarantine_box_when_none_is_set(console: Console,
                                                           fake: FakeController) -> None:
    quarantine_decode(fake, remaining_s=-1.0)  # ran out: the controller sends null
    at = console(fake, "pools")
    no_exceptions(at)
    assert not at.error
    assert "quarantined" not in texts(at.markdown)


def test_the_instance_drill_down_and_the_overview_agree_on_ttft_p50(
        console: Console, fake: FakeController) -> None:
    """The same requests, the same TTFT p50: the project's one percentile (nearest rank,
    ``pdctl_api.stats``), not pandas' interpolation, which reads 25.0 ms for these four."""
    fake.records = make_records(4)  # each through decode-2
    for record, ttft in zip(fake.records, (40.0, 10.0, 30.0, 20.0), strict=True):
        record.ttft_ms = ttft
    overview = by_label(console(fake).metric, "TTFT p50").value
    at = console(fake, "pools")
    by_label(at.selectbox, "instance").set_value("decode-2").run()
    no_exceptions(at)
    assert by_label(at.metric, "Requests").value == "4"
    assert by_label(at.metric, "TTFT p50").value == overview == "20.0 ms"

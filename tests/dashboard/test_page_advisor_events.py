"""The Advisor page's what-if calculator and the Events page's audit log."""

from __future__ import annotations

from tests.dashboard.fake import FakeController
from tests.dashboard.page_helpers import Console, by_label, texts


def test_advisor_what_if(console: Console, fake: FakeController) -> None:
    at = console(fake, "advisor")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["KV cache"] == "1.34 GB"  # Llama-3-70B, 4096 tokens
    assert metrics["Wire time"] == "26.8 ms"  # over IB NDR at 50 GB/s
    by_label(at.selectbox, "KV link").set_value("tcp-100gbe").run()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Wire time"] == "134.2 ms"
    assert "Verdict:" in texts(at.info) + texts(at.success) + texts(at.warning)


def test_events_page_lists_the_audit_log(console: Console, fake: FakeController) -> None:
    at = console(fake, "events")
    table = at.dataframe[0].value
    assert list(table["kind"]) == ["pool.update", "controller.start"]
    assert table["before"].iloc[1] == ""

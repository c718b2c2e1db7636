"""The console's pages under Streamlit's AppTest, against a fake controller."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from controller.models import Role
from controller.reconciler import PoolTarget
from dashboard.config import ConsoleConfig
from tests.dashboard.fake import URL, FakeController, make_instances, make_records

Console = Callable[..., AppTest]
PAGES = ["overview", "transfer", "pools", "controls", "advisor", "events"]


def by_label(widgets: Sequence[Any], label: str) -> Any:
    found = [w for w in widgets if w.label == label]
    assert found, f"no widget {label!r} among {[w.label for w in widgets]}"
    return found[0]


def texts(elements: Sequence[Any]) -> str:
    return "\n".join(str(e.value) for e in elements)


def no_exceptions(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders(console: Console, fake: FakeController, page: str) -> None:
    fake.instances = make_instances(40, 80)
    at = console(fake, page)
    no_exceptions(at)
    assert not at.error
    assert at.title[0].value == page.capitalize()


def test_unreachable_controller_says_so_and_renders_no_page(
        console: Console, fake: FakeController) -> None:
    fake.reachable = False
    at = console(fake)
    no_exceptions(at)
    assert len(at.error) == 1
    message = at.error[0].value
    assert f"Cannot reach the controller at {URL}" in message
    assert "Connection refused" in message and "PDCTL_URL" in message
    assert not at.title  # the page itself is not rendered


def test_console_recovers_when_the_controller_comes_back(
        console: Console, fake: FakeController) -> None:
    fake.reachable = False
    at = console(fake)
    fake.reachable = True
    at.run()
    no_exceptions(at)
    assert not at.error
    assert at.title[0].value == "Overview"


def test_wrong_token_is_explained(console: Console, fake: FakeController) -> None:
    at = console(fake, token="not-the-token")
    no_exceptions(at)
    message = texts(at.error)
    assert "refused the API token (401: missing or invalid bearer token" in message
    assert "token" in message and "state" in message  # names where the token was read
    assert not at.title


def test_missing_token_is_explained(console: Console, fake: FakeController) -> None:
    at = console(fake, token=None)
    assert "No API token" in texts(at.error)
    assert fake.calls == []  # nothing was sent without a token


def test_env_token_source_is_named(console: Console, fake: FakeController) -> None:
    at = console(fake, token="wrong", env_token="wrong")
    assert "PDCTL_TOKEN environment variable" in texts(at.error)


def test_overview_shows_ttft_parts(console: Console, fake: FakeController) -> None:
    at = console(fake)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["prefill"] == "10.0 ms"
    assert metrics["decode scheduling"] != "0.0 ms"
    assert metrics["KV transfer"] != "0.0 ms"
    assert metrics["Disaggregated"] == "67%"
    assert not at.error  # 5 ms of ~26 ms: no transfer alert
    assert len(at.get("vega_lite_chart")) == 5


def test_overview_alerts_when_transfer_dominates(console: Console,
                                                  fake: FakeController) -> None:
    fake.records = make_records(300, transfer_ms=40.0)
    at = console(fake)
    alert = texts(at.error)
    assert "KV transfer is 66% of TTFT" in alert and "alert share of 20%" in alert


def test_pools_page_lists_every_instance(console: Console, fake: FakeController) -> None:
    fake.instances = make_instances(40, 80)
    at = console(fake, "pools")
    table = at.dataframe[0].value
    assert len(table) == 120
    assert set(table["role"]) == {"prefill", "decode"}
    assert "120 of 120 instances" in texts(at.caption)


# ---- controls ----------------------------------------------------------------------------

def review_pool(at: AppTest, role: str, size: int | None = None, tp: int | None = None
                ) -> AppTest:
    if size is not None:
        by_label(at.number_input, f"{role} size").set_value(size)
    if tp is not None:
        by_label(at.number_input, f"{role} TP").set_value(tp)
    by_label(at.button, f"Review {role} change").click()
    return at.run()


def test_scale_down_needs_confirmation(console: Console, fake: FakeController) -> None:
    fake.instances = make_instances(1, 2)
    fake.targets[Role.DECODE] = PoolTarget(2, 2)
    at = console(fake, "controls")
    review_pool(at, "decode", size=1)
    assert fake.changes() == [], "nothing is sent before the operator confirms"
    assert "Confirm a disruptive change — decode pool: 2 x TP2 → 1 x TP2" in texts(at.warning)
    at.button(key="confirm-decode").click().run()
    no_exceptions(at)
    assert fake.changes() == [("PATCH", "/api/v1/pools/decode", {"size": 1})]
    assert "sent, the pool is converging" in texts(at.toast)


def test_tp_change_needs_confirmation_and_cancel_sends_nothing(
        console: Console, fake: FakeController) -> None:
    at = console(fake, "controls")
    review_pool(at, "decode", tp=4)
    assert "disruptive" in texts(at.warning)
    assert "replaces every decode instance" in texts(at.markdown)
    at.button(key="cancel-decode").click().run()
    assert fake.changes() == []
    assert "Confirm" not in texts(at.warning)


def test_scale_up_is_reviewed_then_sent(console: Console, fake: FakeController) -> None:
    at = console(fake, "controls")
    review_pool(at, "decode", size=2)
    assert "Confirm — decode pool: 1 x TP2 → 2 x TP2" in texts(at.info)
    assert not at.warning
    at.button(key="confirm-decode").click().run()
    assert fake.changes() == [("PATCH", "/api/v1/pools/decode", {"size": 2})]
    assert fake.targets[Role.DECODE].size == 2
    # The form now starts from the new desired state.
    assert by_label(at.number_input, "decode size").value == 2


def test_refused_change_shows_the_detail_verbatim(console: Console,
                                                  fake: FakeController) -> None:
    at = console(fake, "controls")
    review_pool(at, "decode", tp=3)
    at.button(key="confirm-decode").click().run()
    no_exceptions(at)
    detail = "TP 3 does not divide llama-3-70b's 64 attention heads"
    errors = texts(at.error)
    assert "Refused by the controller (HTTP 422); nothing was changed" in errors
    assert detail in errors
    assert fake.targets[Role.DECODE].tp == 2
    assert not at.toast


def test_refused_capacity_change_detail_verbatim(console: Console,
                                                 fake: FakeController) -> None:
    at = console(fake, "controls")
    review_pool(at, "decode", size=100)
    at.button(key="confirm-decode").click().run()
    assert ("prefill 1 x TP4, decode 100 x TP2 needs 204 accelerators placed "
            "TP-group-per-node, but the cluster has 4 node(s) x 8 = 32") in texts(at.error)


def test_drain_needs_confirmation(console: Console, fake: FakeController) -> None:
    fake.instances = make_instances(1, 3)
    at = console(fake, "controls")
    by_label(at.selectbox, "instance").set_value("decode-3")
    by_label(at.button, "Review drain").click()
    at.run()
    assert fake.changes() == []
    assert "Confirm a disruptive change — drain decode-3" in texts(at.warning)
    at.button(key="confirm-drain").click().run()
    assert fake.changes() == [("POST", "/api/v1/instances/decode-3/drain", None)]
    assert "decode-3 is draining" in texts(at.toast)


def test_routing_change_sends_only_changed_fields(console: Console,
                                                  fake: FakeController) -> None:
    at = console(fake, "controls")
    by_label(at.selectbox, "decode policy").set_value("round_robin")
    by_label(at.number_input, "disaggregate from prompt tokens").set_value(1024)
    by_label(at.button, "Apply routing").click()
    at.run()
    no_exceptions(at)
    assert fake.changes() == [("PATCH", "/api/v1/routing",
                               {"decode_policy": "round_robin",
                                "disagg_min_prompt_tokens": 1024})]
    assert "routing updated" in texts(at.toast)


def test_refused_routing_change_shows_detail(console: Console, fake: FakeController) -> None:
    at = console(fake, "controls")
    by_label(at.number_input, "disaggregate from prompt tokens").set_value(2_000_000)
    by_label(at.button, "Apply routing").click()
    at.run()
    assert "disagg_min_prompt_tokens: must be at most 1000000" in texts(at.error)
    assert fake.routing["disagg_min_prompt_tokens"] == 512


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


def test_live_refresh_can_be_paused(console: Console, fake: FakeController) -> None:
    at = console(fake)
    at.toggle(key="pdctl_live").set_value(False).run()
    no_exceptions(at)
    assert at.title[0].value == "Overview"


def test_config_refresh_default() -> None:
    assert ConsoleConfig().refresh_s == 2.0

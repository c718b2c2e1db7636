"""The console's pages under Streamlit's AppTest, against a fake controller."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta
from datetime import time as dtime
from typing import Any

import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from controller.config import TargetsSettings
from controller.fleet.guard import Quarantine
from controller.models import PoolTarget, Role
from dashboard import ui
from dashboard.config import RECENT_LIMIT, ConsoleConfig
from tests.dashboard.fake import (
    TOKEN,
    URL,
    FakeController,
    integrity_summary,
    make_instances,
    make_records,
    planner_view,
)

Console = Callable[..., AppTest]
PAGES = ["overview", "transfer", "pools", "controls", "advisor", "planner", "events"]


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


def test_a_token_entered_in_the_console_replaces_a_wrong_one(console: Console,
                                                             fake: FakeController) -> None:
    at = console(fake, token="not-the-token")
    assert not at.title
    by_label(at.text_input, "API token for this session").set_value("still-wrong")
    by_label(at.button, "Use this token").click()
    at.run()
    assert "entered in this console session" in texts(at.error) and not at.title
    by_label(at.text_input, "API token for this session").set_value(TOKEN)
    by_label(at.button, "Use this token").click()
    at.run()
    no_exceptions(at)
    assert not at.error and at.title[0].value == "Overview"
    assert "token entered in this session" in texts(at.sidebar.caption)
    by_label(at.sidebar.button, "Forget the entered token").click()
    at.run()
    assert "refused the API token" in texts(at.error) and not at.title


def test_a_token_no_header_can_carry_is_explained_not_a_crash(console: Console,
                                                              fake: FakeController) -> None:
    at = console(fake, token="tøken")  # e.g. a token file with a stray character
    no_exceptions(at)
    assert "holds characters an HTTP header cannot carry" in texts(at.error)
    assert fake.calls == [] and not at.title  # nothing sent
    by_label(at.text_input, "API token for this session").set_value("🙂")
    by_label(at.button, "Use this token").click()
    at.run()
    no_exceptions(at)
    assert "entered in this console session holds characters" in texts(at.error)


def test_an_actor_beyond_ascii_is_sent_as_its_ascii_part() -> None:
    """The operator's name goes into a header, which carries printable ASCII only."""
    import httpx

    from dashboard.client import ControllerClient

    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["X-Pdctl-Actor"])
        return httpx.Response(200, json=FakeController().routing)

    c = ControllerClient(URL, TOKEN, transport=httpx.MockTransport(handler),
                         actor="pdctl-console/Jørgen")
    c.routing()
    assert seen == ["pdctl-console/Jrgen"]


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


def test_an_empty_window_says_no_data_instead_of_zeros(console: Console,
                                                      fake: FakeController) -> None:
    fake.records = []
    at = console(fake)
    no_exceptions(at)
    metrics = {m.label: m.value for m in at.metric}
    for label in ("TTFT p50", "queue", "prefill", "KV transfer", "decode scheduling",
                  "overhead", "Inter-token gap p99", "Mean ITL p50"):
        assert metrics[label] == "no data", label
    assert "No requests in the last 300 s: no TTFT to draw." in texts(at.info)
    specs = [c.proto.spec for c in at.get("vega_lite_chart")]
    assert len(specs) == 1  # the request rate (0 /s is a rate); no empty TTFT axes, no ring


def test_overview_alerts_when_transfer_dominates(console: Console,
                                                  fake: FakeController) -> None:
    fake.records = make_records(300, transfer_ms=40.0)
    at = console(fake)
    alert = texts(at.error)
    assert "KV transfer is 66% of TTFT" in alert and "alert share of 20%" in alert


def test_overview_health_turns_red_when_a_target_breaks(console: Console,
                                                        fake: FakeController) -> None:
    at = console(fake)
    assert "Healthy" in texts(at.success) and "TTFT p95" in texts(at.success)
    fake.targets_set = TargetsSettings(ttft_p95_ms=5.0)  # the fake's TTFTs are ~26 ms
    at = console(fake)
    red = texts(at.error)
    assert "Target broken" in red and "> 5 ms" in red, red
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Error rate"] == "0.0%" and metrics["Output tokens"].endswith("/s")
    assert metrics["Inter-token gap p99"] == "no data"  # the fake records carry no gaps


def test_targets_are_reviewed_then_sent(console: Console, fake: FakeController) -> None:
    at = console(fake, "controls")
    by_label(at.number_input, "TTFT p95 target (ms)").set_value(800.0)
    by_label(at.button, "Review targets change").click()
    at.run()
    assert fake.changes() == []
    assert "Confirm — targets: ttft_p95_ms" in texts(at.info)
    at.button(key="confirm-targets").click().run()
    no_exceptions(at)
    assert fake.changes() == [("PATCH", "/api/v1/targets", {"ttft_p95_ms": 800.0})]
    assert fake.targets_set.ttft_p95_ms == 800.0


def test_a_viewer_console_shows_everything_and_offers_no_change(
        console: Console, fake: FakeController) -> None:
    fake.viewer = True
    at = console(fake, "controls")
    no_exceptions(at)
    assert "viewer token" in texts(at.info)
    assert not [b for b in at.button if "Review" in str(b.label)]
    assert "viewer token: read only" in texts(at.sidebar.caption)
    at = console(fake, "planner")
    assert "viewer token" in texts(at.info) and not at.get("form")


def marks(spec: Any) -> list[Any]:
    """Every mark of a Vega-Lite spec, layers included."""
    out = [spec["mark"]] if "mark" in spec else []
    for layer in spec.get("layer", []):
        out += marks(layer)
    return out


def test_the_time_charts_of_a_page_share_the_window(console: Console,
                                                    fake: FakeController) -> None:
    at = console(fake)  # the 5-min window; the fake's requests cover its last 30 s
    framed = [c for c in at.get("vega_lite_chart")
              if {"type": "point", "opacity": 0} in marks(json.loads(c.proto.spec))]
    assert len(framed) == 3  # TTFT parts, TTFT percentiles, traffic: one x-axis


def test_a_custom_range_shows_that_range_and_no_other(console: Console,
                                                      fake: FakeController) -> None:
    then = time.time() - 3600  # 300 requests an hour ago (transfer 50 ms), 100 now (5 ms)
    fake.records = make_records(300, transfer_ms=50.0, now=then) + make_records(100)
    at = console(fake)
    by_label(at.selectbox, "Window").set_value(ui.CUSTOM).run()
    start = datetime.fromtimestamp(then - 60).replace(second=0, microsecond=0)
    by_label(at.date_input, "Day").set_value(start.date())
    by_label(at.time_input, "From").set_value(start.time())
    by_label(at.time_input, "To").set_value((start + timedelta(minutes=2)).time()).run()
    no_exceptions(at)
    assert "a fixed range" in texts(at.caption)
    rate = by_label(at.metric, "Request rate")
    assert "300 requests in the window" in rate.proto.help
    assert "p50 50.0 ms" in texts(at.caption)  # the disaggregated requests' own transfer
    assert not any("transfer_ms" in d.value for d in at.dataframe)  # drawn once opened
    at.session_state["overview-recent-table"] = True
    at.run()
    table = next(d.value for d in at.dataframe if "transfer_ms" in d.value)
    # recent requests: the range's, not the newest
    assert len(table) == RECENT_LIMIT and (table["transfer_ms"].isin([0.0, 50.0])).all()
    framed = [c for c in at.get("vega_lite_chart")
              if {"type": "point", "opacity": 0} in marks(json.loads(c.proto.spec))]
    assert framed  # the charts span the range, not the last minutes
    end = datetime.combine(start.date(), (start + timedelta(minutes=2)).time()).timestamp()
    for chart in framed:
        assert chart_edges(chart) == pytest.approx((end - 120, end))
    by_label(at.selectbox, "Window").set_value("5 min").run()
    assert "100 requests in the window" in by_label(at.metric, "Request rate").proto.help


def chart_edges(chart: Any) -> tuple[float, float]:
    """The start and end (unix s) of the invisible layer that spans a time chart's axis."""
    spec = json.loads(chart.proto.spec)
    edge = next(layer for layer in spec["layer"]
                if layer.get("mark") == {"type": "point", "opacity": 0})
    data = next(d.data.data for d in chart.proto.datasets if d.name == edge["data"]["name"])
    times = pa.ipc.open_stream(data).read_pandas()["time"]
    return float(times.iloc[0].timestamp()), float(times.iloc[1].timestamp())


def test_custom_range_across_midnight_and_its_cap() -> None:
    day = date(2026, 12, 1)
    rng = ui.custom_range(day, dtime(23, 50), dtime(0, 10))
    assert rng.window_s == 1200 and rng.end == datetime(2026, 12, 2, 0, 10).timestamp()
    assert ui.custom_range(day, dtime(10, 0), dtime(10, 0)).window_s == ui.MAX_RANGE_S
    ahead = ui.TimeRange(900.0, time.time() + 600)  # started 5 min ago, 10 min to go
    assert ahead.stop() <= time.time() and ahead.start() == ahead.end - 900  # not past now
    window, end = ahead.asked()  # asked from its start up to now, not the last 15 min
    assert end is not None and end <= time.time() and 299 <= window <= 301


def test_a_request_is_found_by_id(console: Console, fake: FakeController) -> None:
    at = console(fake)
    by_label(at.text_input, "Find a request by id").set_value("req-7")
    by_label(at.button, "Find").click()
    at.run()
    no_exceptions(at)
    assert "**req-7** · disaggregated · ok" in texts(at.markdown)  # k % 3 != 0
    by_label(at.text_input, "Find a request by id").set_value("nope")
    by_label(at.button, "Find").click()
    at.run()
    assert "nope" in texts(at.warning)


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


# ---- controls ----------------------------------------------------------------------------

def review_pool(at: AppTest, role: str, size: int | None = None, tp: int | None = None
                ) -> AppTest:
    if size is not None:
        by_label(at.number_input, f"{role} size").set_value(size)
    if tp is not None:  # a choice of valid TPs; a number on an older controller
        tps = [w for w in at.selectbox if w.label == f"{role} TP"]
        (tps[0] if tps else by_label(at.number_input, f"{role} TP")).set_value(tp)
    by_label(at.button, f"Review {role} change").click()
    return at.run()


def test_scale_down_needs_confirmation(console: Console, fake: FakeController) -> None:
    fake.instances = make_instances(1, 2)
    fake.targets[Role.DECODE] = PoolTarget(2, 2)
    at = console(fake, "controls")
    review_pool(at, "decode", size=1)
    assert fake.changes() == [], "nothing is sent before the operator confirms"
    assert fake.dry_runs() == [("PATCH", "/api/v1/pools/decode?dry_run=true", {"size": 1})]
    assert "Confirm a disruptive change — decode pool: 2 x TP2 → 1 x TP2" in texts(at.warning)
    # The controller's plan: the least loaded decode instance drains.
    assert "**drain** decode-2" in texts(at.markdown)
    assert "scale decode down to 1" in texts(at.markdown)
    assert at.button(key="confirm-decode").proto.type == "primary"  # the loud one
    at.button(key="confirm-decode").click().run()
    no_exceptions(at)
    assert fake.changes() == [("PATCH", "/api/v1/pools/decode", {"size": 1})]
    assert "sent, the pool is converging" in texts(at.toast)


def test_tp_change_needs_confirmation_and_cancel_sends_nothing(
        console: Console, fake: FakeController) -> None:
    at = console(fake, "controls")
    review_pool(at, "decode", tp=4)
    assert "disruptive" in texts(at.warning)
    # A rolling replacement: the planner's first step starts a new instance at the new TP.
    assert "**start** a decode instance at TP 4 — TP 4 replacement (0/1)" in texts(at.markdown)
    at.button(key="cancel-decode").click().run()
    assert fake.changes() == []
    assert "Confirm" not in texts(at.warning)


def test_scale_up_is_reviewed_then_sent(console: Console, fake: FakeController) -> None:
    at = console(fake, "controls")
    review_pool(at, "decode", size=2)
    assert "Confirm — decode pool: 1 x TP2 → 2 x TP2" in texts(at.info)
    assert "**start** a decode instance at TP 2 — decode pool below size (1/2)" in texts(
        at.markdown)
    assert not at.warning
    at.button(key="confirm-decode").click().run()
    assert fake.changes() == [("PATCH", "/api/v1/pools/decode", {"size": 2})]
    assert fake.targets[Role.DECODE].size == 2
    # The form now starts from the new desired state.
    assert by_label(at.number_input, "decode size").value == 2


def test_only_valid_tps_are_offered(console: Console, fake: FakeController) -> None:
    at = console(fake, "controls")
    # Llama-3-70B: 64 heads, 8 KV heads; TP2 does not fit 70B in 2 x 80 GB... per the
    # controller's own validation; prefill TP4 pairs with decode TPs that divide or multiply 4.
    assert by_label(at.selectbox, "decode TP").options == ["2", "4", "8"]
    assert by_label(at.selectbox, "prefill TP").options == ["2", "4", "8"]


def test_refused_change_shows_the_detail_verbatim(console: Console,
                                                  fake: FakeController) -> None:
    fake.legacy = True  # an older controller offers no list of valid TPs: any may be asked
    at = console(fake, "controls")
    review_pool(at, "decode", tp=3)  # the dry run refuses it: nothing to confirm
    no_exceptions(at)
    detail = "TP 3 does not divide llama-3-70b's 64 attention heads"
    errors = texts(at.error)
    assert "Refused by the controller (HTTP 422); nothing was changed" in errors
    assert detail in errors
    assert not [b for b in at.button if b.key == "confirm-decode"]
    assert fake.changes() == [] and fake.targets[Role.DECODE].tp == 2
    assert not at.toast


def test_refused_capacity_change_detail_verbatim(console: Console,
                                                 fake: FakeController) -> None:
    at = console(fake, "controls")
    review_pool(at, "decode", size=100)
    assert ("prefill 1 x TP4, decode 100 x TP2 needs 204 accelerators placed "
            "TP-group-per-node, but the cluster has 4 node(s) x 8 = 32") in texts(at.error)
    assert fake.changes() == []


def test_a_change_refused_at_confirmation_shows_the_detail(console: Console,
                                                           fake: FakeController) -> None:
    at = console(fake, "controls")
    review_pool(at, "decode", size=3)
    fake.nodes = 1  # the cluster shrank between the review and the confirmation
    at.button(key="confirm-decode").click().run()
    no_exceptions(at)
    assert "Refused by the controller (HTTP 422); nothing was changed" in texts(at.error)
    assert fake.targets[Role.DECODE].size == 1


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
    by_label(at.button, "Review routing change").click()
    at.run()
    no_exceptions(at)
    assert fake.changes() == [], "nothing is sent before the operator confirms"
    assert "Confirm — routing: disagg_min_prompt_tokens, decode_policy" in texts(at.info)
    assert "would have gone colocated instead of disaggregated" in texts(at.markdown)
    assert by_label(at.button, "Confirm change").proto.type == "secondary"  # harmless
    at.button(key="confirm-routing").click().run()
    assert fake.changes() == [("PATCH", "/api/v1/routing",
                               {"decode_policy": "round_robin",
                                "disagg_min_prompt_tokens": 1024})]
    assert "routing updated" in texts(at.toast)


def test_refused_routing_change_shows_detail(console: Console, fake: FakeController) -> None:
    at = console(fake, "controls")
    by_label(at.number_input, "disaggregate from prompt tokens").set_value(2_000_000)
    by_label(at.button, "Review routing change").click()
    at.run()
    at.button(key="confirm-routing").click().run()
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


# ---- KV integrity, quarantine, suspect requests ------------------------------------------

def frame_with(at: AppTest, column: str) -> Any:
    found = [d.value for d in at.dataframe if column in d.value.columns]
    assert found, f"no table with a {column!r} column"
    return found[0]


def quarantine_decode(fake: FakeController, remaining_s: float = 95.0) -> None:
    fake.quarantine[Role.DECODE] = Quarantine(time.time() + remaining_s, 3,
                                              "process exited with status -4 (SIGILL)")


def test_overview_alerts_on_reads_of_freed_kv(console: Console, fake: FakeController) -> None:
    fake.kv_integrity = integrity_summary(after_in_window=3, suspect=2)
    at = console(fake)
    no_exceptions(at)
    alert = texts(at.error)
    assert "3 reads of freed KV blocks in the last 300 s" in alert
    assert "2 request records are marked suspect" in alert
    assert "may be wrong" in alert
    assert "docs/routing-and-accounting.md" in alert and "vLLM's KV contract" in alert


@pytest.mark.parametrize("page", ["overview", "transfer"])
def test_no_kv_alert_unless_the_controller_raises_it(console: Console, fake: FakeController,
                                                     page: str) -> None:
    # Reads after expiry long ago (cumulative) and in the window, but no alert: quiet.
    fake.kv_integrity = {**integrity_summary(after_in_window=2, suspect=1), "alert": False}
    at = console(fake, page)
    no_exceptions(at)
    assert not at.error
    assert "freed KV blocks" not in texts(at.warning)


def test_transfer_page_shows_the_kv_alert_too(console: Console, fake: FakeController) -> None:
    fake.kv_integrity = integrity_summary(after_in_window=1, suspect=1)
    at = console(fake, "transfer")
    alert = texts(at.error)
    assert "1 read of freed KV blocks" in alert and "1 request record is marked suspect" in alert


def test_overview_warns_when_leases_ran_out(console: Console, fake: FakeController) -> None:
    fake.kv_integrity = integrity_summary(expired_in_window=4)
    at = console(fake)
    no_exceptions(at)
    assert not at.error  # nothing was read late: not red
    warning = texts(at.warning)
    assert "4 finished prefills in the last 300 s held KV blocks for nothing" in warning
    assert "lease ran out" in warning


def test_no_lease_warning_without_expiries_in_window(console: Console,
                                                     fake: FakeController) -> None:
    fake.kv_integrity = integrity_summary()  # 10 expired in total, none in the window
    at = console(fake)
    assert "lease ran out" not in texts(at.warning)


def test_overview_shows_a_quarantined_pool(console: Console, fake: FakeController) -> None:
    quarantine_decode(fake)
    at = console(fake)
    no_exceptions(at)
    errors = texts(at.error)
    assert "Decode pool quarantined" in errors and "Prefill pool" not in errors
    assert "process exited with status -4 (SIGILL)" in errors


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


def test_recent_requests_show_the_suspect_flag(console: Console, fake: FakeController) -> None:
    fake.records[-1].suspect = True  # the newest request
    at = console(fake)
    no_exceptions(at)
    table = frame_with(at, "suspect")
    assert table["id"].iloc[0] == "req-299"
    assert table["suspect"].iloc[0] == "⚠ suspect"
    assert (table["suspect"].iloc[1:] == "").all()
    assert table["kv_handle"].iloc[0] == "cmpl-req-299-0"
    assert any("1 suspect" in e.label for e in at.expander)


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


@pytest.mark.parametrize("page", PAGES)
def test_older_controller_without_the_new_fields(console: Console, fake: FakeController,
                                                 page: str) -> None:
    fake.legacy = True
    quarantine_decode(fake)  # not sent by an older controller
    at = console(fake, page)
    no_exceptions(at)
    assert at.title[0].value == page.capitalize()
    if page == "planner":  # an older controller has no planner: the page says so
        assert "404" in texts(at.error) or "no route" in texts(at.error)
        return
    assert not at.error
    if page == "overview":
        at.session_state["overview-recent-table"] = True  # the expander opened
        at.run()
        assert (frame_with(at, "suspect")["suspect"] == "").all()
    if page == "transfer":
        assert frame_with(at, "notifications_after_expiry")["kv_expired_requests"].isna().all()
        assert "does not report the engines' KV lease counters" in texts(at.caption)


# ---- the Planner page ------------------------------------------------------------------------

def test_planner_page_shows_decisions_and_applies_a_recommendation(
        console: Console, fake: FakeController) -> None:
    at = console(fake, "planner")
    no_exceptions(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["prefill (now → recommended)"] == "1 → 2"
    table = frame_with(at, "reasons")
    assert list(table["prefill"]) == ["1 → 2", "1 → 1"]  # newest first
    assert list(table["outcome"]) == ["recommended", "no change"]
    by_label(at.button, "Review the recommendation").click().run()
    no_exceptions(at)
    assert [c[1] for c in fake.dry_runs()] == ["/api/v1/pools/prefill?dry_run=true"]
    assert fake.changes() == []  # reviewed, not sent
    assert "Confirm — apply the planner's recommendation" in texts(at.warning)
    by_label(at.button, "Confirm").click().run()
    no_exceptions(at)
    assert fake.changes() == [("PATCH", "/api/v1/pools/prefill", {"size": 2})]
    assert fake.targets[Role.PREFILL].size == 2


def test_planner_settings_are_reviewed_then_sent(console: Console,
                                                 fake: FakeController) -> None:
    at = console(fake, "planner")
    by_label(at.number_input, "TTFT p95 target (ms)").set_value(1500.0)
    by_label(at.selectbox, "Mode").set_value("apply")
    by_label(at.button, "Review change").click().run()
    no_exceptions(at)
    assert fake.changes() == []
    pending = texts(at.warning)
    assert "ttft_ms: 2000.0 → 1500.0" in texts(at.markdown)
    assert "planner settings" in pending
    by_label(at.button, "Confirm").click().run()
    assert fake.changes() == [("PATCH", "/api/v1/planner",
                               {"mode": "apply", "ttft_ms": 1500.0})]
    assert fake.planner["mode"] == "apply"


def test_planner_page_without_a_profile_or_a_pass(console: Console,
                                                  fake: FakeController) -> None:
    fake.planner = {**planner_view(history=[], mode="off"),
                    "problem": "no performance profile for sim-x-tp3: `pdctl profile` ...",
                    "profiles": {"prefill": None, "decode": None}, "next_at": None}
    at = console(fake, "planner")
    no_exceptions(at)
    assert "The planner cannot run: no performance profile" in texts(at.warning)
    assert "No decision yet" in texts(at.caption)
    assert not [b for b in at.button if b.label == "Review the recommendation"]

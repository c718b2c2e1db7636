"""The Controls page: pool, drain, routing and target changes, each reviewed (a pool change
by the controller's dry run) and sent only when confirmed; refusals shown verbatim."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from controller.models import PoolTarget, Role
from tests.dashboard.fake import FakeController, make_instances
from tests.dashboard.fake_whatif import figures_of, forecast_of
from tests.dashboard.page_helpers import Console, by_label, frame_with, no_exceptions, texts


def test_targets_are_reviewed_then_sent(console: Console, fake: FakeController) -> None:
    at = console(fake, "controls")
    by_label(at.number_input, "TTFT p95 target (ms)").set_value(800.0)
    by_label(at.button, "Review targets change").click()
    at.run()
    assert fake.changes() == []
    assert "Confirm — targets: ttft_p95_ms 2000 → 800" in texts(at.info)
    at.button(key="confirm-targets").click().run()
    no_exceptions(at)
    assert fake.changes() == [("PATCH", "/api/v1/targets", {"ttft_p95_ms": 800.0})]
    assert fake.targets_set.ttft_p95_ms == 800.0


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
    assert ("Confirm — routing: disagg_min_prompt_tokens 512 → 1024, decode_policy "
            "least_loaded → round_robin") in texts(at.info)  # in words, not raw keys
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


def test_a_reviewed_change_is_scrolled_into_view_once(console: Console,
                                                      fake: FakeController) -> None:
    """The confirmation appears under the form that asked for it, which may be below the
    fold: the run that draws it scrolls it into view (a real browser shows it:
    tests/integration/test_console_fold_browser.py), and a later refresh leaves the page
    where the operator put it."""
    at = console(fake, "controls")
    assert not at.get("html")
    by_label(at.number_input, "TTFT p95 target (ms)").set_value(800.0)
    by_label(at.button, "Review targets change").click()
    at.run()
    [scroll] = at.get("html")
    assert "scrollIntoView" in scroll.proto.body
    assert '".st-key-pdctl-pending-targets"' in scroll.proto.body
    at.run()  # a refresh: the confirmation stays, the page does not move again
    assert "Confirm — targets: ttft_p95_ms" in texts(at.info)
    assert not at.get("html")


def test_a_pool_change_review_shows_its_prediction(console: Console,
                                                   fake: FakeController) -> None:
    at = console(fake, "controls")
    review_pool(at, "decode", size=3)
    no_exceptions(at)
    assert fake.predictions() == [{"decode": {"size": 3}}]
    assert fake.changes() == [], "a prediction changes nothing"
    shown = texts(at.markdown)
    assert "Predicted on the last 300 requests (10.0 min of traffic)" in shown
    assert "within the TTFT target (2,000 ms): 62.0% now → 97.0% proposed" in shown
    table = frame_with(at, "proposed p90")
    ttft = table[table["figure"] == "TTFT"].iloc[0]
    assert (ttft["now p50"], ttft["proposed p50"]) == ("1,800", "900")  # 2 -> 4 instances
    at.button(key="confirm-decode").click().run()
    assert fake.changes() == [("PATCH", "/api/v1/pools/decode", {"size": 3})]


def test_a_change_the_controller_cannot_predict_is_still_reviewed(
        console: Console, fake: FakeController) -> None:
    fake.unpredictable = "no prediction: no profile for my-finetune"
    at = console(fake, "controls")
    review_pool(at, "decode", size=2)
    no_exceptions(at)
    assert "What-if: no prediction: no profile for my-finetune" in texts(at.caption)
    at.button(key="confirm-decode").click().run()
    assert fake.changes() == [("PATCH", "/api/v1/pools/decode", {"size": 2})]


def test_the_last_prediction_is_shown_against_what_was_measured(
        console: Console, fake: FakeController) -> None:
    at = console(fake, "controls")
    assert "What-if: predicted against measured" not in texts(at.subheader)
    forecast = forecast_of(fake.targets, {"decode": {"size": 2}})
    fake.whatif = {
        "forecast": forecast, "status": "measured", "applied_at": 1.0, "converged_at": 2.0,
        "min_requests": 20, "measured": figures_of(1000.0, 0.9),
        "comparison": [{"figure": "ttft", "quantile": "p50", "predicted_ms": 1200.0,
                        "measured_ms": 1000.0, "error": 0.2}]}
    at.run()
    no_exceptions(at)
    assert "What-if: predicted against measured" in texts(at.subheader)
    shown = texts(at.markdown)
    assert "measured on the requests served since the change converged" in shown
    assert "within the TTFT target: predicted 97.0%, measured 90.0% (300 requests)" in shown
    row = frame_with(at, "measured (ms)").iloc[0].to_dict()
    assert row == {"figure": "TTFT", "quantile": "p50", "predicted (ms)": "1,200",
                   "measured (ms)": "1,000", "error": "+20%"}

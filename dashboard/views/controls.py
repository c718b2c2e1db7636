"""Controls: pool size, TP and KV transfer mode (pull, push) per pool, routing policy
(round_robin, least_loaded, cache_aware), the hand-off policy (threshold, slo) and thresholds
(``cache_load_limit`` among them), draining an instance.

Pool changes and drains are reviewed first and sent only after the operator confirms; the
review of a pool change shows the controller's own plan for it (its dry run); a change the
controller refuses shows its ``detail`` verbatim; the convergence card follows the pools live
until they match the desired state."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, get_args

import streamlit as st

from dashboard import changes, integrity, review
from dashboard.client import ApiError
from dashboard.ui import alerts, errors, forecast_card, reads
from dashboard.ui.session import client
from dashboard.ui.sidebar import run_every
from pdctl_api.schema import InstancePublic, PolicyName, PoolPublic, Role, RoutingPublic

POLICY_NAMES: list[str] = list(get_args(PolicyName))  # the router's, for each pool
POLICY_HELP = ("round_robin: in turn; least_loaded: the instance with the fewest requests; "
               "cache_aware: the instance holding the prompt's longest cached prefix (the "
               "engines' KV events) within the load limit below, by load where its KV index "
               "is stale (Pools shows the prefix cache)")

st.title("Controls")
st.caption("Every change goes through the control API and lands in the audit log (Events)")


# ---- pool changes: the controller's dry run first -------------------------------------

def review_pool(role: Role, size: int, tp: int, new_size: int, new_tp: int,
                kv_mode: str = "pull", new_kv_mode: str | None = None) -> None:
    """Ask the controller's dry run what the change would do: its refusal shows at once,
    its planned actions wait for the operator's confirmation."""
    request = changes.pool_request(size, tp, new_size, new_tp, kv_mode, new_kv_mode)
    if request is None:
        review.review(role, None)
        return
    st.session_state.pop(review.PENDING_CHANGE_KEY, None)
    plan = errors.attempt(lambda: client().plan_pool(role, size=request.size, tp=request.tp,
                                                     kv_mode=request.kv_mode))
    if isinstance(plan, ApiError):
        st.session_state[review.CHANGE_OUTCOME_KEY] = (role, False, plan)
        return
    proposed = {k: v for k, v in (("size", request.size), ("tp", request.tp)) if v is not None}
    prediction = forecast_card.predict({role.value: proposed}) if proposed else None
    review.review(role, replace(changes.pool_change(role, size, tp, plan, kv_mode),
                                prediction=prediction))


# ---- convergence (live) ------------------------------------------------------------------------

@st.fragment(run_every=run_every())
@errors.card
def convergence() -> None:
    st.subheader("Convergence")
    cl = reads.cluster()
    cols = st.columns(2)
    for col, role in zip(cols, Role, strict=True):
        pool = cl.pools[role]
        want, have, act = pool.desired.size, pool.actual.ready_at_desired_tp, pool.actual
        q = pool.quarantine
        done = "quarantined" if q else "converged" if pool.converged else "converging…"
        mode = f" · KV {kv_mode_of(pool)}" if has_kv_mode(pool) else ""
        col.markdown(f"**{role}** · desired {want} x TP{pool.desired.tp}{mode} · {done}")
        col.progress(1.0 if want == 0 else min(1.0, have / want),
                     text=f"ready at desired TP{' and KV mode' if mode else ''} {have}/{want}"
                          f" · starting {act.starting} · "
                          f"draining {act.draining}")
        if q is not None:
            col.error(integrity.quarantine_text(role, q), icon=":material/block:")


# ---- pool forms ----------------------------------------------------------------------------

KV_MODES = ["pull", "push"]
KV_MODE_HELP = ("how the KV cache moves from prefill to decode: pull (NixlConnector, the "
                "decode engine reads it after the prefill hop) or push (NixlPushConnector, "
                "both hops sent at once, the prefill engine writes it into the decode "
                "engine's blocks). A change drains and restarts every instance of the pool, "
                "like a TP change")


def has_kv_mode(pool: PoolPublic) -> bool:
    """Whether the controller says the pool's KV transfer mode (an older one does not)."""
    return "kv_mode" in pool.desired.model_fields_set


def kv_mode_of(pool: PoolPublic) -> str:
    return str(getattr(pool.desired, "kv_mode", None) or "pull")


def pool_form(role: Role, pool: PoolPublic, max_tp: int) -> None:
    size, tp, mode = pool.desired.size, pool.desired.tp, kv_mode_of(pool)
    with st.form(f"pool-{role}"):
        kv = f" · KV {mode}" if has_kv_mode(pool) else ""
        st.markdown(f"**{role.capitalize()} pool** · now {size} x TP{tp}{kv}")
        # Keys carry the desired state, so the inputs reset when it changes.
        new_size = st.number_input(f"{role} size", min_value=0, max_value=10_000, value=size,
                                   step=1, key=f"{role}-size-{size}-{tp}-{mode}")
        if pool.valid_tp:  # the controller's own list: only TPs it would accept
            choices = sorted({*pool.valid_tp, tp})
            new_tp = st.selectbox(
                f"{role} TP", choices, index=choices.index(tp),
                key=f"{role}-tp-{size}-{tp}-{mode}",
                help="tensor parallelism: accelerators per instance; only the values that "
                     "divide the model's heads, fit memory and a node, and pair with the "
                     "other pool's TP")
        else:  # an older controller: any TP, checked by its dry run
            new_tp = st.number_input(f"{role} TP", min_value=1, max_value=max(max_tp, tp),
                                     value=tp, step=1, key=f"{role}-tp-{size}-{tp}-{mode}",
                                     help="tensor parallelism: accelerators per instance")
        new_mode = None
        if has_kv_mode(pool):  # an older controller has one mode, pull, and takes no other
            new_mode = st.selectbox(f"{role} KV transfer", KV_MODES,
                                    index=KV_MODES.index(mode) if mode in KV_MODES else 0,
                                    key=f"{role}-kv-{size}-{tp}-{mode}", help=KV_MODE_HELP)
        if st.form_submit_button(f"Review {role} change"):
            review_pool(role, size, tp, int(new_size), int(new_tp), mode, new_mode)
    review.show_pending(role)
    review.show_outcome(role)


def drain_form(instances: list[InstancePublic]) -> None:
    candidates = {i.id: i for i in changes.drainable(instances)}
    with st.form("drain"):
        st.markdown("**Drain an instance** · it finishes its requests, then stops")
        # A stable key, and labels without live figures: a label that changes with each
        # rerun (a running count under load) made a new widget that forgot the choice.
        choice = st.selectbox(
            "instance", list(candidates), index=None, placeholder="choose an instance",
            key="drain-choice", format_func=lambda iid: (
                f"{iid} · {candidates[iid].role} · TP {candidates[iid].tp}"
                if iid in candidates else iid))
        if st.form_submit_button("Review drain"):
            if choice in candidates:
                review.review("drain", changes.drain_change(candidates[choice]))
            elif choice:
                st.session_state[review.CHANGE_OUTCOME_KEY] = (
                    "drain", False, f"{choice} can no longer be drained (it is no longer ready "
                    "or starting)")
            else:
                st.session_state[review.CHANGE_OUTCOME_KEY] = ("drain", False,
                                                               "choose an instance to drain")
    review.show_pending("drain")
    review.show_outcome("drain")


DISAGG_POLICIES: list[str] = list(get_args(RoutingPublic.model_fields["disagg_policy"].annotation))
DISAGG_HELP = ("how each request is handed off: threshold (disaggregated from the prompt "
               "length below) or slo (disaggregated when that is faster for its uncached "
               "tokens, the queues and the KV transfer). Transfer shows each decision and why")


def disagg_policy_input(where: Any, current: RoutingPublic, v: str) -> dict[str, Any]:
    """The hand-off policy's selectbox, where the controller says its policy (an older one
    decides by threshold and has no such setting)."""
    if "disagg_policy" not in current.model_fields_set:
        return {}
    now = current.disagg_policy
    return {"disagg_policy": where.selectbox(
        "hand-off policy", DISAGG_POLICIES,
        index=DISAGG_POLICIES.index(now) if now in DISAGG_POLICIES else 0,
        key=f"r-hp-{v}", help=DISAGG_HELP)}


def routing_form(current: RoutingPublic) -> None:
    v = "-".join(str(x) for x in current.model_dump().values())  # reset after a change
    with st.form("routing"):
        st.markdown("**Routing** · effective for the next request")
        a, b = st.columns(2)
        wanted: dict[str, Any] = {
            "prefill_policy": a.selectbox("prefill policy", POLICY_NAMES,
                                          index=POLICY_NAMES.index(current.prefill_policy),
                                          key=f"r-pp-{v}", help=POLICY_HELP),
            "decode_policy": b.selectbox("decode policy", POLICY_NAMES,
                                         index=POLICY_NAMES.index(current.decode_policy),
                                         key=f"r-dp-{v}", help=POLICY_HELP),
            "disagg_min_prompt_tokens": a.number_input(
                "disaggregate from prompt tokens", min_value=0,
                value=current.disagg_min_prompt_tokens, step=64, key=f"r-min-{v}",
                help="shorter prompts are served colocated by a decode instance"),
            "transfer_alert_share": b.number_input(
                "transfer alert share of TTFT", min_value=0.0, max_value=1.0,
                value=current.transfer_alert_share, step=0.05, format="%.2f",
                key=f"r-alert-{v}"),
            "max_attempts": a.number_input("max attempts per hop", min_value=1, max_value=10,
                                           value=current.max_attempts, key=f"r-att-{v}"),
            "request_timeout_s": b.number_input(
                "request timeout (s)", min_value=0.0,
                value=current.request_timeout_s, step=10.0, key=f"r-to-{v}"),
            "max_inflight": a.number_input(
                "max requests in flight (0: no limit)", min_value=0,
                value=current.max_inflight, step=64, key=f"r-cap-{v}",
                help="admission control: one more client request is answered 429 at once"),
            "max_inflight_per_instance": b.number_input(
                "max in flight per instance (0: no limit)", min_value=0,
                value=current.max_inflight_per_instance, step=8, key=f"r-icap-{v}",
                help="a full instance gets no new request; a full decode pool answers 429"),
            "prefill_max_inflight": a.number_input(
                "prompts in flight per prefill instance (0: no router queue)", min_value=0,
                value=current.prefill_max_inflight, step=1, key=f"r-pcap-{v}",
                help="beyond it, requests wait in the router for a slot on any prefill "
                     "instance, so a scale-up takes the backlog at once"),
            "prefill_queue_timeout_s": b.number_input(
                "longest wait for a prefill slot (s)", min_value=0.1,
                value=current.prefill_queue_timeout_s, step=5.0, key=f"r-pqt-{v}",
                help="then the request is served colocated"),
            **disagg_policy_input(b, current, v),
            "cache_load_limit": a.number_input(
                "cache_aware load limit (requests above the least loaded)", min_value=0,
                max_value=100_000, value=current.cache_load_limit, step=1, key=f"r-cll-{v}",
                help="cache_aware: an instance with more than this many requests (in flight "
                     "plus waiting) above the least loaded one gets no request for its cached "
                     "prefix; 0: affinity only among the least loaded"),
        }
        if st.form_submit_button("Review routing change"):
            patch = changes.routing_patch(current, wanted)
            prompts = None
            if "disagg_min_prompt_tokens" in patch:
                # Unread, the preview is left out; the change itself is not.
                prompts = errors.quietly(
                    lambda: [r.prompt_tokens for r in reads.recent_requests()], None)
            review.review("routing", changes.routing_change(current, patch, prompts)
                          if patch else None)
    review.show_pending("routing")
    review.show_outcome("routing")


@errors.card
def targets_form() -> None:
    current = reads.targets()
    if current is None:
        st.caption("This controller has no service targets (older than them).")
        return
    v = "-".join(f"{x:g}" for x in current.model_dump().values())
    with st.form("targets"):
        st.markdown("**Service targets** · the Overview's health status and the alert rules")
        a, b = st.columns(2)
        wanted = {
            "ttft_p95_ms": a.number_input("TTFT p95 target (ms)", min_value=1.0,
                                          value=current.ttft_p95_ms, step=100.0,
                                          key=f"t-p95-{v}"),
            "ttft_p99_ms": b.number_input("TTFT p99 target (ms)", min_value=1.0,
                                          value=current.ttft_p99_ms, step=100.0,
                                          key=f"t-p99-{v}"),
            "gap_p99_ms": a.number_input("inter-token gap p99 target (ms)", min_value=1.0,
                                         value=current.gap_p99_ms, step=10.0,
                                         key=f"t-gap-{v}"),
            "error_rate": b.number_input("error rate target", min_value=0.0, max_value=1.0,
                                         value=current.error_rate, step=0.005,
                                         format="%.3f", key=f"t-err-{v}"),
        }
        if st.form_submit_button("Review targets change"):
            review.review("targets", changes.targets_change(current, wanted))
    review.show_pending("targets")
    review.show_outcome("targets")


# ---- page --------------------------------------------------------------------------------

@errors.card
def change_forms() -> None:
    """Every form of the page, from one read of the cluster."""
    cluster = reads.cluster()
    max_tp = cluster.hardware.accelerators_per_node
    hw = cluster.hardware
    st.subheader("Pools")
    st.caption(f"Accelerators: {hw.used_accelerators} used of {hw.total_accelerators} "
               f"({hw.nodes} node{'s' if hw.nodes != 1 else ''} x {hw.accelerators_per_node} "
               f"{hw.accelerator}), {hw.total_accelerators - hw.used_accelerators} free")
    cols = st.columns(2)
    for col, pool_role in zip(cols, Role, strict=True):
        with col:
            pool_form(pool_role, cluster.pools[pool_role], max_tp)
    st.subheader("Instances and routing")
    left, right = st.columns(2)
    with left:
        drain_form(cluster.instances)
    with right:
        routing_form(cluster.routing)
    with left:
        targets_form()


convergence()
forecast_card.hindsight()
if reads.may_change():
    change_forms()
else:
    alerts.read_only_note()

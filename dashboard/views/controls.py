"""Controls: pool size and TP per pool, routing policy and thresholds, draining an instance.

Pool changes and drains are reviewed first and sent only after the operator confirms; the
review of a pool change shows the controller's own plan for it (its dry run); a change the
controller refuses shows its ``detail`` verbatim; the convergence card follows the pools live
until they match the desired state."""

from __future__ import annotations

from typing import Any, get_args

import streamlit as st

from dashboard import changes, integrity, ui
from dashboard.changes import PendingChange
from dashboard.client import ApiError
from pdctl_api.schema import InstancePublic, PolicyName, PoolPublic, Role, RoutingPublic

PENDING = "pdctl_pending"
OUTCOME = "pdctl_outcome"  # (section, ok, message) of the last change
POLICIES: list[str] = list(get_args(PolicyName))

st.title("Controls")
st.caption("Every change goes through the control API and lands in the audit log (Events)")


# ---- sending changes -------------------------------------------------------------------------

def _send(section: str, what: str, call: Any) -> None:
    try:
        call()
    except ApiError as exc:
        st.session_state[OUTCOME] = (section, False, exc)
        return
    ui.forget_reads()
    st.session_state[OUTCOME] = (section, True, what)


def confirm_pending() -> None:
    """Button callback: send the reviewed change."""
    held: tuple[str, PendingChange] | None = st.session_state.pop(PENDING, None)
    if held is None:
        return
    p = held[1]
    c = ui.client()
    if p.kind == "pool" and p.role is not None:
        role = p.role
        _send(role, f"{p.title}: sent, the pool is converging",
              lambda: c.set_pool(role, size=p.size, tp=p.tp))
    elif p.kind == "drain" and p.instance_id is not None:
        iid = p.instance_id
        _send("drain", f"{iid} is draining", lambda: c.drain(iid))
    elif p.kind == "targets" and p.patch:
        change = dict(p.patch)
        _send("targets", "targets updated: " + ", ".join(
            f"{k}={val:g}" for k, val in change.items()), lambda: c.set_targets(change))
    elif p.kind == "routing" and p.patch:
        patch = dict(p.patch)
        _send("routing", "routing updated: " + ", ".join(
            f"{k}={val}" for k, val in patch.items()), lambda: c.set_routing(patch))


def cancel_pending() -> None:
    st.session_state.pop(PENDING, None)


def review(section: str, change: PendingChange | None) -> None:
    st.session_state.pop(OUTCOME, None)
    if change is None:
        st.session_state.pop(PENDING, None)
        st.session_state[OUTCOME] = (section, True, "nothing to change")
    else:
        st.session_state[PENDING] = (section, change)


def review_pool(role: Role, size: int, tp: int, new_size: int, new_tp: int) -> None:
    """Ask the controller's dry run what the change would do: its refusal shows at once,
    its planned actions wait for the operator's confirmation."""
    request = changes.pool_request(size, tp, new_size, new_tp)
    if request is None:
        review(role, None)
        return
    st.session_state.pop(PENDING, None)
    try:
        plan = ui.client().plan_pool(role, size=request.size, tp=request.tp)
    except ApiError as exc:
        st.session_state[OUTCOME] = (role, False, exc)
        return
    review(role, changes.pool_change(role, size, tp, plan))


def show_outcome(section: str) -> None:
    """The result of this section's last change: a toast, or the controller's refusal."""
    outcome = st.session_state.get(OUTCOME)
    if not outcome or outcome[0] != section:
        return
    _, ok, body = outcome
    ui.change_outcome(ok, body)
    if ok:
        st.session_state.pop(OUTCOME, None)


def show_pending(section: str) -> None:
    """The confirmation step for a reviewed change of this section."""
    held = st.session_state.get(PENDING)
    if not held or held[0] != section:
        return
    change: PendingChange = held[1]
    with st.container(border=True):
        if change.disruptive:
            st.warning(f"**Confirm a disruptive change — {change.title}**",
                       icon=":material/warning:")
        else:
            st.info(f"**Confirm — {change.title}**", icon=":material/info:")
        if change.kind == "pool":
            st.caption("The controller's plan for its next step (dry run); it plans again "
                       "every step until the pool has converged.")
        st.markdown("\n".join(f"- {e}" for e in change.effects))
        left, right = st.columns(2)
        # The loud button only for a change that drains or stops something.
        left.button("Confirm change", key=f"confirm-{section}",
                    type="primary" if change.disruptive else "secondary",
                    on_click=confirm_pending)
        right.button("Cancel", key=f"cancel-{section}", on_click=cancel_pending)


# ---- convergence (live) ------------------------------------------------------------------------

@st.fragment(run_every=ui.run_every())
def convergence() -> None:
    st.subheader("Convergence")
    try:
        cl = ui.cluster()
    except ApiError as exc:
        ui.card_error(exc)
        return
    cols = st.columns(2)
    for col, role in zip(cols, Role, strict=True):
        pool = cl.pools[role]
        want, have, act = pool.desired.size, pool.actual.ready_at_desired_tp, pool.actual
        q = pool.quarantine
        done = "quarantined" if q else "converged" if pool.converged else "converging…"
        col.markdown(f"**{role}** · desired {want} x TP{pool.desired.tp} · {done}")
        col.progress(1.0 if want == 0 else min(1.0, have / want),
                     text=f"ready at desired TP {have}/{want} · starting {act.starting} · "
                          f"draining {act.draining}")
        if q is not None:
            col.error(integrity.quarantine_text(role, q), icon=":material/block:")


# ---- pool forms ----------------------------------------------------------------------------

def pool_form(role: Role, pool: PoolPublic, max_tp: int) -> None:
    size, tp = pool.desired.size, pool.desired.tp
    with st.form(f"pool-{role}"):
        st.markdown(f"**{role.capitalize()} pool** · now {size} x TP{tp}")
        # Keys carry the desired state, so the inputs reset when it changes.
        new_size = st.number_input(f"{role} size", min_value=0, max_value=10_000, value=size,
                                   step=1, key=f"{role}-size-{size}-{tp}")
        if pool.valid_tp:  # the controller's own list: only TPs it would accept
            choices = sorted({*pool.valid_tp, tp})
            new_tp = st.selectbox(
                f"{role} TP", choices, index=choices.index(tp), key=f"{role}-tp-{size}-{tp}",
                help="tensor parallelism: accelerators per instance; only the values that "
                     "divide the model's heads, fit memory and a node, and pair with the "
                     "other pool's TP")
        else:  # an older controller: any TP, checked by its dry run
            new_tp = st.number_input(f"{role} TP", min_value=1, max_value=max(max_tp, tp),
                                     value=tp, step=1, key=f"{role}-tp-{size}-{tp}",
                                     help="tensor parallelism: accelerators per instance")
        if st.form_submit_button(f"Review {role} change"):
            review_pool(role, size, tp, int(new_size), int(new_tp))
    show_pending(role)
    show_outcome(role)


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
                review("drain", changes.drain_change(candidates[choice]))
            elif choice:
                st.session_state[OUTCOME] = ("drain", False,
                                             f"{choice} can no longer be drained (it is no "
                                             "longer ready or starting)")
            else:
                st.session_state[OUTCOME] = ("drain", False, "choose an instance to drain")
    show_pending("drain")
    show_outcome("drain")


def routing_form(current: RoutingPublic) -> None:
    v = "-".join(str(x) for x in current.model_dump().values())  # reset after a change
    with st.form("routing"):
        st.markdown("**Routing** · effective for the next request")
        a, b = st.columns(2)
        wanted: dict[str, Any] = {
            "prefill_policy": a.selectbox("prefill policy", POLICIES,
                                          index=POLICIES.index(current.prefill_policy),
                                          key=f"r-pp-{v}"),
            "decode_policy": b.selectbox("decode policy", POLICIES,
                                         index=POLICIES.index(current.decode_policy),
                                         key=f"r-dp-{v}"),
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
        }
        if st.form_submit_button("Review routing change"):
            patch = changes.routing_patch(current, wanted)
            prompts = None
            if "disagg_min_prompt_tokens" in patch:
                try:
                    prompts = [r.prompt_tokens for r in ui.recent_requests()]
                except ApiError:
                    prompts = None  # the preview is left out; the change itself is not
            review("routing", changes.routing_change(current, patch, prompts)
                   if patch else None)
    show_pending("routing")
    show_outcome("routing")


def targets_form() -> None:
    try:
        current = ui.targets()
    except ApiError as exc:
        ui.card_error(exc)
        return
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
            review("targets", changes.targets_change(current, wanted))
    show_pending("targets")
    show_outcome("targets")


# ---- page --------------------------------------------------------------------------------

convergence()
if not ui.may_change():
    st.info(ui.READ_ONLY_NOTE, icon=":material/visibility:")
    st.stop()
try:
    cluster = ui.cluster()
except ApiError as exc:
    ui.card_error(exc)
    st.stop()
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

"""Typed views: the control API's answers (``pdctl_api.schema``) built from the controller's
own objects -- the cluster, instances, request records, the planner's state -- field by field,
so that a field missing or renamed on either side is a type error here, not a dict that fails
validation at run time.

The live routing settings and service targets need no view: the configuration's sections
(``RoutingSettings``, ``TargetsSettings``) are the API's models with defaults. Where an owner
computes an answer's content as JSON itself (``Fleet.pool_view``, ``requests_log.stats`` and
``timeseries``, ``advisor.advise``, ``LeaseWatch.summary``, the store's audit rows, the
planner's observations), the view validates that part into its model and types the rest."""

from __future__ import annotations

import time

from controller.api.state import AppState
from controller.config import Settings
from controller.fleet.reconcile import Action, Drain, Start
from controller.models import Instance, RequestRecord, Role
from controller.obs.handoff_report import handoff_report
from controller.planner.service import Plan
from controller.requests_log import stats, timeseries
from controller.router.table import RoutingTable
from controller.sizing import advisor, kvfit
from pdctl_api import profiles
from pdctl_api.schema import (
    AdmissionPublic,
    BucketPublic,
    ClusterPublic,
    HandoffPublic,
    HardwarePublic,
    HealthPublic,
    InstancePublic,
    KvIntegrityPublic,
    LoadPublic,
    ModelPublic,
    NixlPublic,
    NixlTotals,
    PlanLoad,
    PlannedAction,
    PlannerBounds,
    PlannerPublic,
    PlanObserved,
    PlanPublic,
    PoolPlanPublic,
    PoolPublic,
    PoolSize,
    PoolUtilization,
    RequestPublic,
    StatsPublic,
    TimeseriesPublic,
    TpAdvicePublic,
)
from pdctl_api.schema.cluster import KvPeerPublic, RouterWorkerPublic

# ---- instances and pools -------------------------------------------------------------------


def instance_view(inst: Instance, inflight: int, handles_out: int = 0) -> InstancePublic:
    """One instance; ``inflight`` and ``handles_out``: the routing table's counts of its
    requests and of the KV handles it gave out."""
    return InstancePublic(
        id=inst.id, role=inst.role, url=inst.url, state=inst.state, tp=inst.tp,
        accelerators=list(inst.accelerators), created_at=inst.created_at,
        ready_at=inst.ready_at,
        load=LoadPublic(inflight=inflight, kv_handles_out=handles_out,
                        running=inst.running, waiting=inst.waiting,
                        kv_cache_usage=inst.kv_usage),
        nixl=NixlPublic(transfers=inst.nixl_xfers, seconds=inst.nixl_xfer_s,
                        bytes=inst.nixl_bytes, recent_xfer_ms=inst.recent_xfer_ms,
                        kv_expired_requests=inst.kv_expired,
                        notifications_after_expiry=inst.kv_after_expiry,
                        failed_transfers=inst.nixl_failed),
        last_error=inst.last_error, pid=inst.pid, node=inst.node,
        kv_mode="push" if inst.kv_mode == "push" else "pull",
        kv_peer=None if inst.kv_peer is None else KvPeerPublic.model_validate(inst.kv_peer))


def instances_view(st: AppState, instances: list[Instance]) -> list[InstancePublic]:
    return [instance_view(i, st.table.inflight(i.id), st.table.handles_out(i.id))
            for i in instances]


def pool_view(st: AppState, role: Role) -> PoolPublic:
    """The pool's desired and actual state, as the fleet counts it."""
    return PoolPublic.model_validate(st.fleet.pool_view(role))


def planned(action: Action) -> PlannedAction:
    """A reconciler action as the API shows it."""
    if isinstance(action, Start):
        return PlannedAction(kind="start", role=action.role, tp=action.tp,
                             kv_mode="push" if action.kv_mode == "push" else "pull",
                             reason=action.reason)
    kind = "drain" if isinstance(action, Drain) else "stop"
    return PlannedAction(kind=kind, instance_id=action.instance_id, reason=action.reason)


def pool_plan_view(st: AppState, role: Role, size: int | None, tp: int | None,
                   actions: list[PlannedAction], kv_mode: str | None = None
                   ) -> PoolPlanPublic:
    """The dry run of a pool change: the desired state it asks for and the planned steps."""
    now = st.fleet.targets[role]
    tp = now.tp if tp is None else tp
    mode = now.kv_mode if kv_mode is None else kv_mode
    return PoolPlanPublic(role=role, desired=PoolSize(size=now.size if size is None else size,
                                                      tp=tp,
                                                      kv_mode="push" if mode == "push"
                                                      else "pull"),
                          actions=actions, notes=pool_notes(st, role, tp))


def pool_notes(st: AppState, role: Role, tp: int) -> list[str]:
    """A decode pool's KV capacity at ``tp`` against the contexts of the last 10 minutes."""
    s = st.settings
    # External engines' memory is not known; the CPU lab's KV space is
    # vllm.cpu_kv_cache_gib, not an accelerator's memory.
    if role is not Role.DECODE or s.backend == "external" or s.hardware.is_cpu:
        return []
    c = st.requests.columns(600.0)
    ok = c.select(c.ok)
    contexts = ok.col("prompt_tokens") + ok.col("output_tokens")
    m = profiles.model(s.model.profile_name) if s.backend == "sim" else s.model_profile
    fit = kvfit.fit(m, s.hardware.profile, tp, contexts,
                    advisor.DEFAULT_ISL + advisor.DEFAULT_OSL)
    return [fit.note()]


def model_view(s: Settings) -> ModelPublic:
    """The served model, with its numbers where known."""
    m = s.known_profile
    name, served = s.model.profile_name, s.model.public_name
    if m is None:
        return ModelPublic(name=name, served_name=served, params=None, layers=None,
                           heads=None, kv_heads=None, head_dim=None, kv_bytes_per_token=None)
    return ModelPublic(name=name, served_name=served, params=m.params, layers=m.layers,
                       heads=m.heads, kv_heads=m.kv_heads, head_dim=m.head_dim,
                       kv_bytes_per_token=m.kv_bytes_per_token)


def cluster_view(st: AppState) -> ClusterPublic:
    s, f = st.settings, st.fleet
    per_node, nodes, _ = f.capacity()  # a Ray cluster's nodes, read live, or the config's
    return ClusterPublic(
        model=model_view(s),
        backend=s.backend,
        hardware=HardwarePublic(accelerator=s.hardware.accelerator,
                                accelerators_per_node=per_node, nodes=nodes,
                                total_accelerators=per_node * nodes,
                                used_accelerators=f.registry.used_accelerators(),
                                kv_link=s.hardware.kv_link),
        pools={r: pool_view(st, r) for r in Role},
        routing=st.table.settings,  # the routing settings are their own answer
        instances=instances_view(st, list(f.registry)),
        time_scale=s.time_scale, state_problem=st.store.recheck(),
        kv_lease_s=None if s.backend == "external" else float(s.kv.lease_s),
        router_workers=[RouterWorkerPublic(**w) for w in st.workers.public()]
        if st.workers is not None else [])


def _ready_counts(table: RoutingTable) -> dict[Role, int]:
    return {r: len(table.ready(r)) for r in Role}


def health_view(table: RoutingTable) -> HealthPublic:
    """``/healthz``: ready instances per pool."""
    return HealthPublic(status="ok", ready=_ready_counts(table))


def readiness_view(table: RoutingTable, prefill_wanted: bool) -> HealthPublic:
    """``/readyz``: whether the fleet can serve -- a ready decode instance, and a ready
    prefill instance when the prefill pool is meant to have one (``prefill_wanted``: its
    desired size is above 0, so long prompts are meant to be disaggregated)."""
    ready = _ready_counts(table)
    reason = None
    if not ready[Role.DECODE]:
        reason = "no ready decode instance"
    elif prefill_wanted and not ready[Role.PREFILL]:
        reason = "no ready prefill instance (the prefill pool's desired size is above 0)"
    return HealthPublic(status="not ready" if reason else "ready", ready=ready, reason=reason)


# ---- requests and their statistics ---------------------------------------------------------


def request_view(r: RequestRecord) -> RequestPublic:
    return RequestPublic(
        id=r.id, started_at=r.started_at, endpoint=r.endpoint, path=r.path, status=r.status,
        stream=r.stream, prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens,
        prefill_instance=r.prefill_instance, decode_instance=r.decode_instance,
        queue_ms=r.queue_ms, prefill_ms=r.prefill_ms, transfer_ms=r.transfer_ms,
        decode_sched_ms=r.decode_sched_ms, overhead_ms=r.overhead_ms, ttft_ms=r.ttft_ms,
        itl_ms=r.itl_ms, e2e_ms=r.e2e_ms, kv_bytes=r.kv_bytes, retries=r.retries,
        error=r.error, kv_handle=r.kv_handle, suspect=r.suspect, gap_p99_ms=r.gap_p99_ms,
        gap_max_ms=r.gap_max_ms, cached_tokens_predicted=r.cached_tokens_predicted,
        cached_tokens=r.cached_tokens,
        decode_cached_tokens_predicted=r.decode_cached_tokens_predicted,
        decision=r.decision, decision_reason=r.decision_reason,
        kv_fallback=r.kv_fallback)


def nixl_totals(instances: list[Instance]) -> NixlTotals:
    """KV moved by NIXL as the engines count it (decode side), and its bandwidth."""
    nbytes = sum(i.nixl_bytes for i in instances)
    seconds = sum(i.nixl_xfer_s for i in instances)
    return NixlTotals(transfers=sum(i.nixl_xfers for i in instances), bytes=nbytes,
                      seconds=seconds, gbps=nbytes / 1e9 / seconds if seconds > 0 else 0.0)


def utilization(table: RoutingTable, role: Role) -> PoolUtilization:
    """The pool's ready instances now: requests in flight, engine load, KV moved."""
    ready = table.ready(role)
    n = len(ready)
    inflight = [table.inflight(i.id) for i in ready]
    busy = sum(1 for i, k in zip(ready, inflight, strict=True) if k or i.running)
    return PoolUtilization(
        ready_instances=n, inflight=sum(inflight), running=sum(i.running for i in ready),
        waiting=sum(i.waiting for i in ready), busy_share=busy / n if n else 0.0,
        kv_cache_usage_mean=sum(i.kv_usage for i in ready) / n if n else 0.0,
        nixl=nixl_totals(ready))


def admission_view(st: AppState) -> AdmissionPublic:
    rs = st.table.settings
    p = st.proxy  # with the router workers' (``controller.workers``)
    return AdmissionPublic(inflight=p.inflight + p.others_inflight,
                           max_inflight=rs.max_inflight,
                           max_inflight_per_instance=rs.max_inflight_per_instance,
                           refused_total=p.refused_total + p.others_refused,
                           prefill_waiting=st.table.prefill_waiting + p.others_waiting)


def stats_view(st: AppState, window_s: float, end: float | None) -> StatsPublic:
    """The window's aggregates (``requests_log.stats``), the pools and admission now, and
    the KV lease integrity over the window."""
    cols, covered = st.requests.between(window_s, end)
    return StatsPublic(
        **stats(cols, window_s, st.table.settings.transfer_alert_share, covered),
        pools={r: utilization(st.table, r) for r in Role},
        total_requests=st.requests.total, admission=admission_view(st),
        kv_integrity=KvIntegrityPublic.model_validate(st.lease_watch.summary(window_s)),
        handoff=HandoffPublic.model_validate(handoff_report(
            [r for r in st.requests.window(window_s, end) if end is None or r.started_at < end],
            st.table.settings.disagg_policy,
            st.fleet.desired.targets[Role.PREFILL].size,
            st.fallback.summary(window_s) if st.fallback else {}, window_s)))


def timeseries_view(st: AppState, window_s: float, step_s: float, end: float | None
                    ) -> TimeseriesPublic:
    now = time.time() if end is None else min(end, time.time())  # as ``between`` does
    cols, _ = st.requests.between(window_s, end)
    return TimeseriesPublic(window_s=window_s, step_s=step_s, now=now,
                            buckets=[BucketPublic.model_validate(b)
                                     for b in timeseries(cols, window_s, step_s, now)])


# ---- the planner ---------------------------------------------------------------------------


def plan_view(p: Plan) -> PlanPublic:
    return PlanPublic(
        at=p.at, mode=p.mode, current=p.current, recommended=p.recommended,
        reasons=list(p.reasons), hold=p.hold,
        observed=None if p.observed is None else PlanObserved.model_validate(p.observed),
        predicted=None if p.predicted is None else PlanLoad.model_validate(p.predicted),
        applied=p.applied, error=p.error,
        tp_advice=None if p.tp_advice is None else TpAdvicePublic.model_validate(p.tp_advice))


def planner_view(st: AppState, history: int) -> PlannerPublic:
    """The planner's live settings, bounds and profiles, and its last ``history`` plans."""
    pl, live = st.planner, st.planner.live
    b = pl.bounds()
    plans = list(pl.history)[-history:] if history else []
    return PlannerPublic(
        mode=live.mode, predictor=live.predictor, interval_s=live.interval_s,
        ttft_ms=live.ttft_ms, itl_ms=live.itl_ms, time_scale=pl.time_scale,
        bounds=PlannerBounds(min_prefill=b.min_prefill, max_prefill=b.max_prefill,
                             min_decode=b.min_decode, max_decode=b.max_decode,
                             accelerator_budget=b.accelerator_budget),
        profiles={r: (p.key if p is not None else None) for r, p in pl.profiles().items()},
        problem=pl.problem(), next_at=pl.next_at, history=[plan_view(p) for p in plans])

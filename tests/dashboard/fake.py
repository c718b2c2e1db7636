"""A fake controller behind ``httpx.MockTransport``: the control API's routes and response
shapes, computed with the controller's own aggregation and validation functions, over
synthetic request records and instances. Records every call. A pool change's dry run
(``?dry_run=true``) answers the controller's own planner's actions for the pool.

``legacy=True`` answers like a controller older than the KV-integrity and quarantine fields
(no ``kv_integrity``, ``quarantine``, ``suspect``/``kv_handle`` or lease counters, no
``/api/v1/cache``). ``/api/v1/cache`` is the controller's own report (``cache_report``) over
the records and ``kv_index`` (by default every live instance's index healthy)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
from pydantic import ValidationError

from controller.api.control import planned
from controller.config import TargetsSettings, describe_validation_error
from controller.errors import InvalidChange, Unpredictable
from controller.fleet.guard import Quarantine
from controller.fleet.history import LoadSamples
from controller.fleet.reconcile import Capacity, FleetState, Member, Start, reconcile
from controller.kvevents.hub import IndexState
from controller.kvevents.index import InstanceHealth
from controller.kvevents.report import cache_report
from controller.models import Instance, InstanceState, PoolTarget, RequestPath, RequestRecord, Role
from controller.planner.capacity import profile_capacities
from controller.planner.profile import ProfileIndex, profile_key
from controller.planner.utilization import Seen, utilization_json
from controller.requests_log import bucket_grid, stats, timeseries
from controller.sizing import advisor, fit
from dashboard.client import ControllerClient
from pdctl_api import profiles
from tests.dashboard.fake_handoff import handoff_view, strip_legacy
from tests.dashboard.fake_whatif import whatif_answer

TOKEN = "secret-token"
URL = "http://fake-controller:8080"
MODEL = profiles.model("llama-3-70b")
HW = profiles.hardware("h100-sxm")


def make_records(n: int, transfer_ms: float = 5.0, now: float | None = None
                 ) -> list[RequestRecord]:
    """``n`` finished requests over the last ``n / 10`` seconds, two in three disaggregated."""
    now = time.time() if now is None else now
    out = []
    for k in range(n):
        disagg = k % 3 != 0
        prompt = 600 + (k % 7) * 100 if disagg else 20
        parts = {"queue_ms": 1.0, "prefill_ms": 10.0,
                 "transfer_ms": transfer_ms if disagg else 0.0,
                 "decode_sched_ms": 8.0 if disagg else 0.0, "overhead_ms": 2.0}
        out.append(RequestRecord(
            id=f"req-{k}", started_at=now - (n - k) * 0.1, endpoint="/v1/completions",
            path=RequestPath.DISAGGREGATED if disagg else RequestPath.COLOCATED,
            status="ok", stream=bool(k % 2), prompt_tokens=prompt, output_tokens=16,
            prefill_instance="prefill-1" if disagg else None, decode_instance="decode-2",
            ttft_ms=sum(parts.values()), itl_ms=5.0, e2e_ms=100.0,
            kv_bytes=profiles.kv_bytes(MODEL, prompt, 16) if disagg else 0,
            kv_handle=f"cmpl-req-{k}-0" if disagg else None, **parts))
    return out


def integrity_summary(after_in_window: float = 0.0, expired_in_window: float = 0.0,
                 suspect: int = 0) -> dict[str, Any]:
    """``/stats`` ``kv_integrity`` as ``LeaseWatch.summary`` shapes it."""
    return {"expired_requests": 10.0 + expired_in_window,
            "notifications_after_expiry": 1.0 + after_in_window,
            "expired_in_window": expired_in_window, "after_expiry_in_window": after_in_window,
            "suspect_requests": suspect, "alert": after_in_window > 0}


LEASE_FIELDS = ("kv_expired_requests", "notifications_after_expiry")


def index_health(instance: str, stale_reason: str | None = None, blocks: int = 120
                 ) -> InstanceHealth:
    """One instance's block index as ``BlockIndex.health`` shapes it."""
    return InstanceHealth(instance, blocks, 41, stale_reason is not None, stale_reason, 2.5,
                          42, 0, 0, 0, 0)


def with_cache(records: list[RequestRecord], reported: float | None = 0.4,
               predicted: float | None = 0.45, decode_share: float = 0.3) -> list[RequestRecord]:
    """The records with the prefix cache's numbers: ``reported`` and ``predicted`` shares of
    each prompt cached on the instance that computed it (None: not reported / predicted),
    ``decode_share`` of a disaggregated prompt already held by its decode instance."""
    for r in records:
        if predicted is not None:
            r.cached_tokens_predicted = int(r.prompt_tokens * predicted)
        if reported is not None:
            r.cached_tokens = int(r.prompt_tokens * reported)
        if r.path is RequestPath.DISAGGREGATED and predicted is not None:
            r.decode_cached_tokens_predicted = int(r.prompt_tokens * decode_share)
    return records


def planner_pass(at: float, current: tuple[int, int], recommended: tuple[int, int], rate: float,
         **extra: Any) -> dict[str, Any]:
    """One planner pass as ``/api/v1/planner`` shows it."""
    load = {"request_rate": rate, "prompt_tokens": 3000.0, "output_tokens": 150.0}
    return {"at": at, "mode": "advisory",
            "current": {"prefill": current[0], "decode": current[1]},
            "recommended": {"prefill": recommended[0], "decode": recommended[1]},
            "reasons": [f"prefill: {rate * 3000:,.0f} prompt tokens/s predicted"],
            "hold": None, "applied": False, "error": None, "predicted": load,
            "observed": {"requests": int(rate * 10), "load": load, "ttft_p95_ms": 900.0,
                         "itl_p95_ms": 40.0, "itl_mean_ms": 30.0, "prefill_ms_mean": 250.0,
                         "prefill_queue_p95_ms": 10.0, "decode_queue_p95_ms": 5.0,
                         "decode_concurrency": 4.0, "disagg_token_share": 1.0}, **extra}


def planner_view(history: list[dict[str, Any]] | None = None, mode: str = "advisory"
                 ) -> dict[str, Any]:
    now = time.time()
    return {"mode": mode, "predictor": "constant", "interval_s": 10.0, "ttft_ms": 2000.0,
            "itl_ms": 60.0, "time_scale": 1.0,
            "bounds": {"min_prefill": 1, "max_prefill": 8, "min_decode": 1, "max_decode": 16,
                       "accelerator_budget": 32},
            "profiles": {"prefill": "sim-llama-3-70b-h100-sxm-tp4",
                         "decode": "sim-llama-3-70b-h100-sxm-tp2"},
            "problem": None, "next_at": now + 5,
            "history": history if history is not None else [
                planner_pass(now - 20, (1, 1), (1, 1), 2.0),
                planner_pass(now - 10, (1, 1), (2, 1), 6.0)]}


def make_instances(prefill: int, decode: int, prefill_tp: int = 4, decode_tp: int = 2
                   ) -> list[Instance]:
    out, n = [], 0
    for role, count, tp in ((Role.PREFILL, prefill, prefill_tp), (Role.DECODE, decode, decode_tp)):
        for _ in range(count):
            n += 1
            out.append(Instance(id=f"{role.value}-{n}", role=role, tp=tp,
                                url=f"http://127.0.0.1:{9000 + n}", state=InstanceState.READY,
                                running=float(n % 5), waiting=float(n % 3),
                                kv_usage=(n % 10) / 10))
    return out


@dataclass
class FakeController:
    records: list[RequestRecord] = field(default_factory=lambda: make_records(300))
    instances: list[Instance] = field(default_factory=lambda: make_instances(1, 1))
    targets: dict[Role, PoolTarget] = field(default_factory=lambda: {
        Role.PREFILL: PoolTarget(1, 4), Role.DECODE: PoolTarget(1, 2)})
    routing: dict[str, Any] = field(default_factory=lambda: {
        "disagg_min_prompt_tokens": 512, "transfer_alert_share": 0.2,
        "prefill_policy": "round_robin", "decode_policy": "least_loaded",
        "max_attempts": 3, "request_timeout_s": 600.0, "disagg_policy": "threshold"})
    kv_integrity: dict[str, Any] = field(default_factory=integrity_summary)
    quarantine: dict[Role, Quarantine] = field(default_factory=dict)
    planner: dict[str, Any] = field(default_factory=lambda: planner_view())
    targets_set: TargetsSettings = field(default_factory=TargetsSettings)
    viewer: bool = False  # the console holds the viewer token
    legacy: bool = False
    token: str = TOKEN
    reachable: bool = True
    nodes: int = 4
    calls: list[tuple[str, str, Any]] = field(default_factory=list)
    audit: list[dict[str, Any]] | None = None  # the audit log, newest first (None: a default)
    load_samples: LoadSamples | None = None  # the engines' polls (None: one per bucket)
    # /cache: each instance's block index (None: every live instance's, healthy)
    kv_index: list[IndexState] | None = None
    # /whatif: the last prediction and its fate; a prediction asked for is ``forecast_of``
    # the proposal, or refused (409) with ``unpredictable`` as the reason
    whatif: dict[str, Any] = field(default_factory=lambda: {"forecast": None})
    unpredictable: str | None = None

    def client(self, token: str | None = TOKEN) -> ControllerClient:
        return ControllerClient(URL, token, transport=httpx.MockTransport(self.handle))

    def changes(self) -> list[tuple[str, str, Any]]:
        """Calls that may change something: neither reads, dry runs nor predictions."""
        return [c for c in self.calls if c[0] != "GET" and "dry_run=true" not in c[1]
                and not c[1].startswith("/api/v1/whatif")]

    def predictions(self) -> list[Any]:
        """The bodies of the what-if predictions asked for."""
        return [c[2] for c in self.calls if c[1] == "/api/v1/whatif/pools"]

    def dry_runs(self) -> list[tuple[str, str, Any]]:
        return [c for c in self.calls if "dry_run=true" in c[1]]

    @staticmethod
    def inflight(inst: Instance) -> int:
        """Requests in flight (the router's count in a real controller): fixed per id."""
        return int(inst.id.rsplit("-", 1)[-1]) % 4

    # ---- the API ------------------------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        if not self.reachable:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        body = json.loads(request.content) if request.content else None
        dry = "?dry_run=true" if request.url.params.get("dry_run") == "true" else ""
        self.calls.append((request.method, request.url.path + dry, body))
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return httpx.Response(401, json={
                "detail": "missing or invalid bearer token (see STATE_DIR/token)"})
        try:
            return httpx.Response(200, json=self.route(request, body))
        except InvalidChange as exc:
            return httpx.Response(422, json={"detail": str(exc), "field": exc.field})
        except KeyError as exc:
            return httpx.Response(404, json={"detail": f"no instance {exc.args[0]!r}"})
        except Unpredictable as exc:
            return httpx.Response(409, json={"detail": str(exc)})

    def route(self, request: httpx.Request, body: Any) -> Any:
        path = request.url.path.removeprefix("/api/v1")
        q = request.url.params
        window = float(q.get("window_s", 60))
        key = (request.method, path)
        if key == ("GET", "/cluster"):
            return self.cluster()
        if key == ("GET", "/routing"):
            return self.routing_view()
        if key == ("GET", "/stats"):
            recs = self.window(window)
            if "end" in q:  # a window in the past: [end - window, end)
                end = float(q["end"])
                recs = [r for r in self.records if end - window <= r.started_at < end]
            out = stats(recs, window, self.routing["transfer_alert_share"])
            out = {**out, "pools": {}, "total_requests": len(self.records)}
            if not self.legacy:
                out["kv_integrity"] = self.kv_integrity
                out["handoff"] = handoff_view(recs, self.routing["disagg_policy"],
                                              self.targets[Role.PREFILL].size, window)
            return out
        if key == ("GET", "/utilization"):
            if self.legacy:
                raise KeyError("/utilization")  # 404: an older controller has none
            return self.utilization(window, float(q["step_s"]),
                                    min(float(q.get("end", time.time())), time.time()))
        if key == ("GET", "/cache"):
            if self.legacy:
                raise KeyError("/cache")  # 404: an older controller has none
            return self.cache(window, float(q.get("step_s", 10)),
                              min(float(q.get("end", time.time())), time.time()))
        if key == ("GET", "/timeseries"):
            now = min(float(q.get("end", time.time())), time.time())
            recs = [r for r in self.records if now - window <= r.started_at < now]
            buckets = timeseries(recs, window, float(q["step_s"]), now)
            if self.legacy:
                strip_legacy([], buckets)
            return {"window_s": window, "step_s": float(q["step_s"]), "now": now,
                    "buckets": buckets}
        if key == ("GET", "/requests"):
            since, until = float(q.get("since", 0.0)), float(q.get("until", float("inf")))
            chosen = [r for r in self.records if since <= r.started_at < until]
            out = [r.public() for r in reversed(chosen[-int(q.get("limit", 100)):])]
            if self.legacy:
                for r in out:
                    del r["kv_handle"], r["suspect"]
                strip_legacy(out, [])
            return out
        if key == ("GET", "/advisor"):
            end = float(q.get("end", time.time()))
            recs = [r for r in self.records if end - window <= r.started_at < end]
            return advisor.advise(MODEL, HW, profiles.link("ib-ndr"), 4, 2, recs, None, 0.2)
        if key == ("GET", "/events"):
            since, until = float(q.get("since", 0.0)), float(q.get("until", float("inf")))
            return [e for e in self.events() if since <= e["ts"] < until]
        if request.method == "PATCH" and path.startswith("/pools/"):
            role = Role(path.rsplit("/", 1)[1])
            if q.get("dry_run") == "true":
                return self.plan_pool(role, body)
            return self.set_pool(role, body)
        if key == ("PATCH", "/routing"):
            return self.set_routing(body)
        if request.method == "GET" and path.startswith("/requests/"):
            rid = path.removeprefix("/requests/")
            found = [r for r in self.records if r.id == rid]
            if not found:
                raise KeyError(rid)
            out = [found[-1].public()]
            if self.legacy:
                strip_legacy(out, [])
            return out[0]
        if key == ("GET", "/access"):
            if self.legacy:
                raise KeyError("/access")
            return {"role": "viewer" if self.viewer else "admin", "may_change": not self.viewer}
        if path == "/targets":
            if self.legacy:
                raise KeyError("/targets")  # 404: an older controller has no targets
            if request.method == "PATCH":
                try:
                    self.targets_set = TargetsSettings.model_validate(
                        {**self.targets_set.model_dump(), **body})
                except ValidationError as exc:
                    raise InvalidChange(describe_validation_error(exc, "targets.")) from None
            return self.targets_set.model_dump()
        if key == ("GET", "/planner") and not self.legacy:
            return self.planner
        if key == ("PATCH", "/planner") and not self.legacy:
            unknown = set(body) - {"mode", "ttft_ms", "itl_ms", "interval_s", "predictor"}
            if unknown or not body:
                raise InvalidChange(f"bad planner change {body}", next(iter(unknown), None))
            self.planner = {**self.planner, **body}
            return self.planner
        if request.method == "POST" and path.endswith("/drain"):
            return self.drain(path.split("/")[2])
        if request.method == "GET" and path.startswith("/instances/") and path.endswith("/log"):
            iid = path.split("/")[2]
            return {"id": iid, "log": f"INFO engine log line of {iid}"}
        if path.startswith("/whatif"):
            return whatif_answer(self, key, body)
        raise InvalidChange(f"fake controller: no route {key}")

    def utilization(self, window: float, step: float, now: float) -> dict[str, Any]:
        """The controller's own computation over ``load_samples``, or, by default, each live
        instance polled once per bucket at the load it shows now."""
        start, n = bucket_grid(window, step, now)
        samples = self.load_samples or LoadSamples.of(
            (start + (k + 0.5) * step, i.id, i.running, i.waiting, i.kv_usage)
            for i in self.instances if not i.state.terminal for k in range(n))
        index = ProfileIndex()
        cap = profile_capacities(lambda tp: index.find("sim", MODEL.name, HW.name, tp),
                                 lambda tp: profile_key("sim", MODEL.name, HW.name, tp), 60.0)
        seen = {i.id: Seen(i.role, i.tp, i.state.value) for i in self.instances}
        return utilization_json(samples, self.records, seen, cap, window, step, now, 1.0, 60.0)

    def cache(self, window: float, step: float, now: float) -> dict[str, Any]:
        """``controller.api.cache.cache_view`` over the fake's records and index."""
        start, _ = bucket_grid(window, step, now)
        records = [r for r in self.records if start <= r.started_at < now]
        states = self.kv_index if self.kv_index is not None else [
            IndexState(i.id, True, index_health(i.id)) for i in self.instances
            if not i.state.terminal]
        policies = {Role.PREFILL: self.routing["prefill_policy"],
                    Role.DECODE: self.routing["decode_policy"]}
        return cache_report(records, states, {i.id: i.role for i in self.instances}, policies,
                            lambda tokens: profiles.kv_bytes(MODEL, tokens, 16), window, step,
                            start, now)

    def window(self, window_s: float) -> list[RequestRecord]:
        cutoff = time.time() - window_s
        return [r for r in self.records if r.started_at >= cutoff]

    def pool_view(self, role: Role) -> dict[str, Any]:
        t = self.targets[role]
        mine = [i for i in self.instances if i.role is role]
        ready = sum(1 for i in mine if i.state is InstanceState.READY and i.tp == t.tp)
        return {"desired": {"size": t.size, "tp": t.tp,
                            **({} if self.legacy else {"kv_mode": t.kv_mode})},
                "actual": {"ready": sum(1 for i in mine if i.state is InstanceState.READY),
                           "starting": sum(1 for i in mine
                                           if i.state is InstanceState.STARTING),
                           "draining": sum(1 for i in mine
                                           if i.state is InstanceState.DRAINING),
                           "ready_at_desired_tp": ready},
                "converged": ready == t.size,
                **({} if self.legacy else {
                    "quarantine": self.quarantine_view(role),
                    "valid_tp": fit.valid_tps(
                        MODEL, HW, 8, role, self.targets[Role.DECODE if role is Role.PREFILL
                                                         else Role.PREFILL].tp)})}

    def quarantine_view(self, role: Role) -> dict[str, Any] | None:
        q, now = self.quarantine.get(role), time.time()
        return q.public(now) if q is not None and q.until > now else None

    def instance_view(self, inst: Instance) -> dict[str, Any]:
        out = inst.public(self.inflight(inst))
        if self.legacy:
            for f in LEASE_FIELDS:
                del out["nixl"][f]
            out.pop("kv_mode", None), out.pop("kv_peer", None)
        return out

    def routing_view(self) -> dict[str, Any]:
        """The routing settings; an older controller has no ``disagg_policy``."""
        return {k: v for k, v in self.routing.items()
                if not (self.legacy and k == "disagg_policy")}

    def cluster(self) -> dict[str, Any]:
        return {
            "model": {"name": MODEL.name, "served_name": MODEL.name, "params": MODEL.params,
                      "layers": MODEL.layers, "heads": MODEL.heads,
                      "kv_heads": MODEL.kv_heads, "head_dim": MODEL.head_dim,
                      "kv_bytes_per_token": MODEL.kv_bytes_per_token},
            "backend": "sim",
            "hardware": {"accelerator": HW.name, "accelerators_per_node": 8,
                         "nodes": self.nodes, "total_accelerators": 8 * self.nodes,
                         "used_accelerators": 6, "kv_link": "ib-ndr"},
            "pools": {r.value: self.pool_view(r) for r in Role},
            "routing": self.routing_view(),
            "instances": [self.instance_view(i) for i in self.instances],
        }

    def events(self) -> list[dict[str, Any]]:
        if self.audit is not None:
            return self.audit
        return [{"id": 2, "ts": time.time(), "actor": "pdctl-console", "kind": "pool.update",
                 "target": "decode", "before": {"size": 1, "tp": 2},
                 "after": {"size": 2, "tp": 2}, "detail": None},
                {"id": 1, "ts": time.time() - 5, "actor": "controller",
                 "kind": "controller.start", "target": "controller", "before": None,
                 "after": {"backend": "sim"}, "detail": None}]

    def check(self, role: Role, body: dict[str, Any]) -> dict[Role, PoolTarget]:
        out = dict(self.targets) if body.keys() == {"kv_mode"} else fit.check_change(
            self.targets, role, body.get("size"), body.get("tp"), model=MODEL, hw=HW,
            per_node=8, nodes=self.nodes, managed=True)
        modes = {r: t.kv_mode for r, t in self.targets.items()}
        if body.get("kv_mode") is not None:
            if body["kv_mode"] not in ("pull", "push"):
                raise InvalidChange(f"KV mode must be pull or push, got {body['kv_mode']!r}")
            modes[role] = body["kv_mode"]
        return {r: replace(t, kv_mode=modes[r]) for r, t in out.items()}

    def set_pool(self, role: Role, body: dict[str, Any]) -> dict[str, Any]:
        self.targets = self.check(role, body)
        return self.pool_view(role)

    def plan_pool(self, role: Role, body: dict[str, Any]) -> dict[str, Any]:
        """What ``Fleet.preview_pool`` answers: the planner's actions for this pool."""
        targets = self.check(role, body)
        live = tuple(Member(i.id, i.role, i.tp, i.state, self.inflight(i), i.created_at,
                            kv_mode=i.kv_mode) for i in self.instances if not i.state.terminal)
        state = FleetState(targets, live, Capacity(8, self.nodes), time.monotonic(), 30.0)
        actions = reconcile(state)
        mine = {i.id for i in live if i.role is role}
        return {"role": role.value, "desired": {"size": targets[role].size,
                                                "tp": targets[role].tp,
                                                "kv_mode": targets[role].kv_mode},
                "actions": [planned(a).model_dump(mode="json") for a in actions
                            if (a.role is role if isinstance(a, Start)
                                else a.instance_id in mine)]}

    def set_routing(self, patch: dict[str, Any]) -> dict[str, Any]:
        if patch.get("disagg_min_prompt_tokens", 0) > 1_000_000:
            raise InvalidChange("disagg_min_prompt_tokens: must be at most 1000000")
        self.routing = {**self.routing, **patch}
        return self.routing

    def drain(self, instance_id: str) -> dict[str, Any]:
        inst = next((i for i in self.instances if i.id == instance_id), None)
        if inst is None:
            raise KeyError(instance_id)
        inst.state = InstanceState.DRAINING
        return self.instance_view(inst)

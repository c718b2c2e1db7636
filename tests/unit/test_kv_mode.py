"""A pool's KV transfer mode (pull: NixlConnector, push: NixlPushConnector): its validation, the
rolling replace of a mode change (like a TP change), the desired state that keeps it, the
launchers' connector config and the NIXL identity each instance exposes."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx
import pytest

from controller.config import Settings, load_settings
from controller.errors import ConfigError, InvalidChange
from controller.fleet import Fleet, build_fleet
from controller.fleet.desired import Desired
from controller.fleet.kv_mode import EXTERNAL_PUSH_REFUSAL, kv_mode_refusal
from controller.fleet.reconcile import (
    Capacity,
    Drain,
    FleetState,
    Member,
    PoolTarget,
    Start,
    Stop,
    reconcile,
)
from controller.launchers import vllm as vllm_launcher
from controller.launchers.base import Launched, Launcher, LaunchSpec
from controller.launchers.process import ProcessLauncher
from controller.launchers.vllm import (
    VllmEngineKind,
    installed_push_refusal,
    kv_transfer_config,
    push_refusal,
)
from controller.models import InstanceState as S
from controller.models import Role
from controller.store import Store

P, D = Role.PREFILL, Role.DECODE

# ---- the pure validation ------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "backend", "problem", "refused"), [
    ("pull", "sim", None, None),
    ("pull", "vllm", "no push here", None),  # pull never asks
    ("pull", "external", None, None),
    ("push", "sim", None, None),
    ("push", "vllm", None, None),
    ("push", "vllm", "the installed vLLM has none",
     "KV push for the prefill pool: the installed vLLM has none"),
    ("push", "external", None, EXTERNAL_PUSH_REFUSAL),
    ("both", "sim", None, "KV mode must be pull or push, got 'both'"),
])
def test_kv_mode_refusal(mode: str, backend: str, problem: str | None,
                         refused: str | None) -> None:
    assert kv_mode_refusal(P, mode, backend, problem) == refused


def test_the_external_refusal_says_why() -> None:
    assert "does not know the NIXL identity (engine id, side channel) of engines it did not " \
           "start" in EXTERNAL_PUSH_REFUSAL


def _fake_python(tmp_path: Path, name: str, script: str) -> str:
    """An "interpreter" that answers the push check with ``script`` (shell)."""
    exe = tmp_path / name / "python"
    exe.parent.mkdir()
    exe.write_text(f"#!/bin/sh\n{script}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def test_installed_vllm_is_checked_once_per_interpreter(tmp_path: Path) -> None:
    yes = _fake_python(tmp_path, "a", "echo 'PUSH True'")
    no = _fake_python(tmp_path, "b", "echo 'PUSH False'")
    assert installed_push_refusal(yes) is None
    assert "has no NixlPushConnector" in str(installed_push_refusal(no))
    Path(no).write_text("#!/bin/sh\necho 'PUSH True'\n")
    assert "has no NixlPushConnector" in str(installed_push_refusal(no))  # checked once
    broken = _fake_python(tmp_path, "c", "echo 'ModuleNotFoundError: No module named vllm' "
                                         ">&2; exit 1")
    assert "No module named vllm" in str(installed_push_refusal(broken))


def test_push_on_cpu_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = _fake_python(tmp_path, "py", "echo 'PUSH True'")
    cpu = load_settings(None, backend="vllm", hardware={"accelerator": "cpu-lab"},
                        model={"name": "lab-tiny", "path": str(tmp_path)},
                        vllm={"python": python}, pools={"prefill": {"size": 1, "tp": 1},
                                                        "decode": {"size": 1, "tp": 1}})
    why = push_refusal(cpu)  # refused on CPU hosts by default, with what the lab showed
    assert why is not None and "execute_model" in why and "vllm.push_on_cpu" in why
    allowed = cpu.model_copy(update={"vllm": cpu.vllm.model_copy(update={"push_on_cpu": True})})
    assert push_refusal(allowed) is None  # the operator's choice; the vLLM has push
    monkeypatch.setattr(vllm_launcher, "PUSH_ON_CPU_REFUSAL", None)
    assert push_refusal(cpu) is None


# ---- the rolling replace ------------------------------------------------------------------


def member(iid: str, mode: str = "pull", state: S = S.READY, tp: int = 2,
           created: float = 0.0) -> Member:
    return Member(iid, D, tp, state, 0, created, None, mode)


def plan(decode: PoolTarget, *instances: Member, free: int = 100) -> list[object]:
    return list(reconcile(FleetState({P: PoolTarget(0, 4), D: decode}, instances,
                                     Capacity.with_free(free), 100.0, 30.0)))


def test_mode_change_surges_one_new_mode_instance_and_drains_nothing_yet() -> None:
    actions = plan(PoolTarget(2, 2, "push"), member("d1"), member("d2"))
    assert actions == [Start(D, 2, "KV push replacement (0/2)", (0, 1), "push")]


def test_an_old_mode_instance_drains_once_its_replacement_is_ready() -> None:
    actions = plan(PoolTarget(2, 2, "push"), member("d1"), member("d2", created=5.0),
                   member("d3", "push", created=50.0))
    drains = [a for a in actions if isinstance(a, Drain)]
    assert drains == [Drain("d2", "KV pull -> push: replacement ready")]  # newest first
    assert not [a for a in actions if isinstance(a, Start)]  # surge of one at a time
    draining = Member("d2", D, 2, S.DRAINING, 3, 5.0, 99.0, "pull")
    actions = plan(PoolTarget(2, 2, "push"), member("d1"), draining,
                   member("d3", "push", created=50.0))
    assert actions == [Start(D, 2, "KV push replacement (1/2)", (0, 1), "push")]


def test_both_modes_serve_while_the_replacement_starts() -> None:
    actions = plan(PoolTarget(1, 2, "push"), member("d1"),
                   member("d2", "push", S.STARTING, created=50.0))
    assert actions == []  # d1 (pull) keeps serving until d2 (push) is ready


def test_an_old_mode_instance_still_starting_is_stopped() -> None:
    actions = plan(PoolTarget(1, 2, "push"), member("d1", "push"),
                   member("d2", "pull", S.STARTING))
    assert actions == [Stop("d2", "KV pull -> push: replaced before it was ready")]


def test_tp_and_mode_change_together() -> None:
    actions = plan(PoolTarget(1, 4, "push"), member("d1", tp=2), member("d2", "push", tp=4))
    assert actions == [Drain("d1", "TP 2 -> 4, KV pull -> push: replacement ready")]
    actions = plan(PoolTarget(1, 4, "push"), member("d1", tp=2))
    assert actions == [Start(D, 4, "TP 4, KV push replacement (0/1)", (0, 1, 2, 3), "push")]


def test_no_room_for_a_surge_drains_first() -> None:
    actions = plan(PoolTarget(1, 2, "push"), member("d1"), free=0)
    assert actions == [Drain("d1", "KV pull -> push: no spare accelerators for a surge "
                                   "instance, draining first")]


# ---- the desired state --------------------------------------------------------------------


def _desired(tmp_path: Path, stored: object = None, backend_problem: str | None = None,
             **kw: object) -> tuple[Desired, Store]:
    settings = load_settings(None, controller={"state_dir": tmp_path}, **kw)  # type: ignore[arg-type]
    store = Store(tmp_path / "state.db")
    if stored is not None:
        store.put("desired", stored)
    return Desired(settings, store, managed=settings.backend != "external",
                   push_problem=lambda: backend_problem), store


def test_a_mode_change_is_kept_and_recorded(tmp_path: Path) -> None:
    desired, store = _desired(tmp_path)
    target = desired.set(D, None, None, "op", kv_mode="push")
    assert target == PoolTarget(1, 2, "push")
    stored = store.get("desired")
    assert stored is not None and stored["decode"] == {"size": 1, "tp": 2, "kv_mode": "push"}
    [ev] = store.events(1)
    assert (ev["kind"], ev["before"], ev["after"]) == (
        "pool.update", {"size": 1, "tp": 2, "kv_mode": "pull"},
        {"size": 1, "tp": 2, "kv_mode": "push"})
    # A size change keeps the mode; the other pool keeps its own.
    assert desired.set(D, 2, None, "op") == PoolTarget(2, 2, "push")
    assert desired.targets[P].kv_mode == "pull"
    assert desired.set(P, None, 2, "op", kv_mode="push") == PoolTarget(1, 2, "push")
    assert desired.targets[D] == PoolTarget(2, 2, "push")


def test_a_state_stored_without_mode_reads_as_pull(tmp_path: Path) -> None:
    desired, _ = _desired(tmp_path, {"prefill": {"size": 1, "tp": 4},
                                     "decode": {"size": 3, "tp": 2}})
    assert desired.targets[D] == PoolTarget(3, 2, "pull")
    desired, _ = _desired(tmp_path, {"prefill": {"size": 1, "tp": 4, "kv_mode": "push"},
                                     "decode": {"size": 3, "tp": 2, "kv_mode": "push"}})
    assert desired.targets[P] == PoolTarget(1, 4, "push")


def test_a_stored_push_the_engines_cannot_run_resets_to_the_config(tmp_path: Path) -> None:
    desired, store = _desired(tmp_path, {"prefill": {"size": 1, "tp": 4, "kv_mode": "push"},
                                         "decode": {"size": 3, "tp": 2}}, "no push here")
    assert desired.targets == {P: PoolTarget(1, 4), D: PoolTarget(1, 2)}
    assert "no push here" in str(store.events(1)[0]["detail"])


def test_refused_mode_changes_change_nothing(tmp_path: Path) -> None:
    desired, store = _desired(tmp_path, backend_problem="the installed vLLM has none")
    before = (dict(desired.targets), store.get("desired"), len(store.events(100)))
    with pytest.raises(InvalidChange, match="the installed vLLM has none") as exc:
        desired.set(P, 2, None, "op", kv_mode="push")
    assert exc.value.field == "pools.prefill.kv_mode"
    with pytest.raises(InvalidChange, match="nothing to change"):
        desired.set(P, None, None, "op")
    assert (dict(desired.targets), store.get("desired"), len(store.events(100))) == before


def test_push_on_the_external_backend_is_refused(tmp_path: Path) -> None:
    pools = {"prefill": {"urls": ["http://p"]}, "decode": {"urls": ["http://d"]}}
    desired, _ = _desired(tmp_path, backend="external", pools=pools)
    with pytest.raises(InvalidChange, match="did not start"):
        desired.check(D, None, None, "push")
    with pytest.raises(InvalidChange, match="configured URLs"):
        desired.check(D, None, None, "pull")
    with pytest.raises(ConfigError, match="pools.decode.kv_mode: .*did not start"):
        _desired(tmp_path, backend="external",
                 pools={**pools, "decode": {"urls": ["http://d"], "kv_mode": "push"}})


def test_config_default_and_push(tmp_path: Path) -> None:
    desired, _ = _desired(tmp_path, pools={"prefill": {"kv_mode": "push"}})
    assert desired.targets == {P: PoolTarget(1, 4, "push"), D: PoolTarget(1, 2, "pull")}


# ---- the fleet: launch specs, instances, adoption -----------------------------------------


class FakeLauncher(Launcher):
    name = "fake"

    def __init__(self) -> None:
        self.started: list[LaunchSpec] = []
        self.stopped: list[str] = []
        self.healthy: set[str] = set()
        self.found: dict[str, Launched] = {}

    async def start(self, spec: LaunchSpec) -> Launched:
        self.started.append(spec)
        return Launched(url=f"http://{spec.instance_id}", handle=spec.instance_id,
                        kv_peer={"engine_id": spec.instance_id, "host": "10.0.0.1",
                                 "port": 5600, "tp_size": spec.tp})

    async def stop(self, launched: Launched, grace_s: float = 5.0) -> None:
        self.stopped.append(launched.handle)

    async def reattach(self) -> dict[str, Launched]:
        return self.found


class Clock:
    t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def fleet_env(tmp_path: Path) -> tuple[Fleet, FakeLauncher, Clock, Store]:
    launcher = FakeLauncher()

    def handler(request: httpx.Request) -> httpx.Response:
        ok = request.url.host in launcher.healthy
        return httpx.Response(200 if ok else 503, text="")

    settings = load_settings(None, controller={"state_dir": tmp_path},
                             pools={"prefill": {"size": 1, "tp": 1},
                                    "decode": {"size": 2, "tp": 1}},
                             model={"name": "llama-3-8b"})
    store = Store(tmp_path / "state.db")
    clock = Clock()
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    fleet = build_fleet(settings, store, launcher, client, clock)[0]
    return fleet, launcher, clock, store


async def _healthy_tick(fleet: Fleet, launcher: FakeLauncher, clock: Clock) -> None:
    launcher.healthy = {s.instance_id for s in launcher.started}
    clock.t += 1
    await fleet.tick()


async def test_a_mode_change_rolls_the_pool(
        fleet_env: tuple[Fleet, FakeLauncher, Clock, Store]) -> None:
    fleet, launcher, clock, store = fleet_env
    await fleet.tick()
    await _healthy_tick(fleet, launcher, clock)
    old = {i.id for i in fleet.ready(D)}
    assert len(old) == 2 and all(s.kv_mode == "pull" for s in launcher.started)
    d = fleet.registry.get(sorted(old)[0])
    assert d is not None and d.kv_peer == {"engine_id": d.id, "host": "10.0.0.1",
                                           "port": 5600, "tp_size": 1}
    assert d.public()["kv_mode"] == "pull" and d.public()["kv_peer"] == d.kv_peer

    fleet.set_pool(D, None, None, "op", kv_mode="push")
    assert fleet.pool_view(D)["converged"] is False
    await fleet.tick()
    new = launcher.started[-1]
    assert (new.role, new.kv_mode) == (D, "push")
    assert {i.id for i in fleet.ready(D)} == old  # both old ones serve meanwhile
    inst = fleet.registry.get(new.instance_id)
    assert inst is not None and inst.kv_mode == "push"
    await _healthy_tick(fleet, launcher, clock)  # the push one is ready: one pull drains
    modes = sorted(i.kv_mode for i in fleet.ready(D))
    assert modes == ["pull", "push"]
    draining = [i for i in fleet.registry if i.state is S.DRAINING]
    assert len(draining) == 1 and draining[0].kv_mode == "pull"
    for _ in range(4):
        await _healthy_tick(fleet, launcher, clock)
    assert sorted(i.kv_mode for i in fleet.ready(D)) == ["push", "push"]
    assert fleet.pool_view(D)["converged"] is True
    assert fleet.pool_view(D)["desired"] == {"size": 2, "tp": 1, "kv_mode": "push"}
    reasons = [e["detail"] for e in store.events(200) if e["kind"] == "instance.draining"]
    assert reasons and all(r == "KV pull -> push: replacement ready" for r in reasons)
    starting = [e for e in store.events(200) if e["kind"] == "instance.starting"
                and e["after"]["kv_mode"] == "push"]
    assert len(starting) == 2
    live = store.get("live_instances") or []
    assert {r["kv_mode"] for r in live if r["role"] == "decode"} == {"push"}
    await fleet.shutdown()


async def test_adoption_compares_the_mode(
        fleet_env: tuple[Fleet, FakeLauncher, Clock, Store]) -> None:
    fleet, launcher, _, store = fleet_env
    fleet.set_pool(D, None, None, "op", kv_mode="push")
    store.put("live_instances", [
        {"id": "prefill-1", "role": "prefill", "tp": 1, "state": "ready"},  # no mode: pull
        {"id": "decode-2", "role": "decode", "tp": 1, "state": "ready"},  # pull: not wanted
        {"id": "decode-3", "role": "decode", "tp": 1, "kv_mode": "push", "state": "ready"},
    ])
    peer = {"engine_id": "decode-3", "host": "10.0.0.2", "port": 5601, "tp_size": 1}
    launcher.found = {i: Launched(f"http://{i}", i, kv_peer=peer if i == "decode-3" else None)
                      for i in ("prefill-1", "decode-2", "decode-3")}
    launcher.healthy = set(launcher.found)
    events = await fleet.recover()
    assert sorted(i.id for i in fleet.registry) == ["decode-3", "prefill-1"]
    d3 = fleet.registry.get("decode-3")
    assert d3 is not None and (d3.kv_mode, d3.kv_peer) == ("push", peer)
    by = {e["target"]: e for e in events}
    assert "not wanted: the decode pool is 2 at TP 1, KV push" in by["decode-2"]["detail"]
    await fleet.shutdown()


# ---- the launchers ------------------------------------------------------------------------


def _vllm_settings(tmp_path: Path) -> Settings:
    return load_settings(None, backend="vllm", hardware={"accelerator": "cpu-lab"},
                         model={"name": "lab-tiny", "path": str(tmp_path)},
                         pools={"prefill": {"size": 1, "tp": 1},
                                "decode": {"size": 1, "tp": 1}})


def test_kv_transfer_config_by_mode(tmp_path: Path) -> None:
    s = _vllm_settings(tmp_path)
    pull = kv_transfer_config(P, s, "pull", "prefill-1")
    push = kv_transfer_config(D, s, "push", "decode-7")
    assert (pull["kv_connector"], pull["engine_id"]) == ("NixlConnector", "prefill-1")
    assert (push["kv_connector"], push["engine_id"], push["kv_role"]) == (
        "NixlPushConnector", "decode-7", "kv_consumer")
    assert "engine_id" not in kv_transfer_config(P, s)


def test_vllm_engines_carry_their_mode_and_identity(tmp_path: Path) -> None:
    kind = VllmEngineKind(_vllm_settings(tmp_path))
    spec = LaunchSpec("prefill-3", P, 1, (0,), tmp_path / "p.log", "push")
    cmd = kind.command(spec, "10.1.1.1", 8100, 5557)
    cfg = json.loads(cmd.argv[cmd.argv.index("--kv-transfer-config") + 1])
    assert (cfg["kv_connector"], cfg["engine_id"]) == ("NixlPushConnector", "prefill-3")
    assert cmd.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5557"
    assert kind.kv_peer(spec, "10.1.1.1", 8100, 5557) == {
        "engine_id": "prefill-3", "host": "10.1.1.1", "port": 5557, "tp_size": 1}
    positional = LaunchSpec("decode-4", D, 1, (1,), tmp_path / "d.log")
    assert positional.kv_mode == "pull"


async def test_the_process_launcher_hands_over_the_identity(tmp_path: Path) -> None:
    launcher = ProcessLauncher(VllmEngineKind(_vllm_settings(tmp_path)))
    launcher.engine.command = lambda *a, **k: type(  # type: ignore[method-assign]
        "C", (), {"argv": ["sleep", "30"], "env": {}, "nice": 0})()
    spec = LaunchSpec("decode-9", D, 1, (0,), tmp_path / "d.log", "push")
    launched = await launcher.start(spec)
    try:
        assert launched.kv_peer is not None
        assert launched.kv_peer["engine_id"] == "decode-9"
        assert launched.kv_peer["port"] == launched.handle["side_channel_port"]
        assert (launched.kv_peer["host"], launched.kv_peer["tp_size"]) == ("127.0.0.1", 1)
    finally:
        await launcher.close()

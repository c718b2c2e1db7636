"""One engine instance on the modelled clock: the live simulated engine's scheduler and step
cost, stepped by events instead of sleeps.

Each step: the scheduler plans (``Scheduler.schedule``), the step lasts the roofline's
``step_duration`` of its prefill chunks and decoding sequences, then the scheduler applies it
(``complete``) and the hops it served hear of their tokens. A decode hop whose KV is remote
waits, its blocks reserved, for the transfer of the blocks its own prefix cache lacks
(``transfer_seconds`` of their bytes on the link, as the live engine's pull sleeps); the
prefill engine's handle is freed when the transfer ends. As in the live engine, transfers on
one link do not slow each other, and a decode engine renews the leases it waits on, so no
handle expires in a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from controller.engines.sim.cost import step_duration
from controller.engines.sim.engine import capacity_blocks
from controller.engines.sim.scheduler import Scheduler, Seq, StepPlan
from controller.models import Instance
from controller.whatif.events import EventQueue
from pdctl_api import profiles


@dataclass(frozen=True)
class EngineShape:
    """What every engine of a run shares (vLLM's engine arguments that the model reads)."""

    model: profiles.ModelProfile
    hardware: profiles.HardwareProfile
    link: profiles.LinkProfile
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192


class Listener(Protocol):
    def first_token(self, hop: Hop) -> None: ...

    def finished(self, hop: Hop) -> None: ...


@dataclass(eq=False, slots=True)
class Hop:
    """One request's visit to one engine, as the engine saw it (modelled seconds)."""

    seq: Seq
    listener: Listener
    source: tuple[DesEngine, str] | None = None  # KV to pull: (prefill engine, handle id)
    arrived: float = 0.0
    scheduled_at: float | None = None
    first_at: float | None = None
    last_at: float = 0.0
    kv_s: float | None = None  # the KV transfer, for a decode hop with remote KV
    kv_bytes: int = 0
    gaps: list[float] | None = None  # inter-token gaps, when asked for (a list to fill)
    finished_at: float = 0.0
    tag: object = None  # the listener's own

    def token(self, now: float) -> None:
        if self.first_at is None:
            self.first_at = self.last_at = now
            self.listener.first_token(self)
            return
        if self.gaps is not None:
            self.gaps.append(now - self.last_at)
        self.last_at = now


@dataclass(eq=False)
class DesEngine:
    events: EventQueue
    instance: Instance
    shape: EngineShape
    scheduler: Scheduler = field(init=False)
    busy_s: float = 0.0  # modelled seconds spent in steps
    steps: int = 0
    kv_bytes: int = 0  # pulled by this engine
    _hops: dict[str, Hop] = field(default_factory=dict)
    _stepping: bool = False  # a step runs or is due

    def __post_init__(self) -> None:
        s = self.shape
        self.scheduler = Scheduler(
            capacity_blocks(s.model, s.hardware, self.instance.tp, s.block_size), s.block_size,
            s.max_num_seqs, s.max_num_batched_tokens)

    @property
    def id(self) -> str:
        return self.instance.id

    def submit(self, hop: Hop) -> None:
        hop.arrived = self.events.now
        self.scheduler.add(hop.seq)
        self._hops[hop.seq.seq_id] = hop
        self._kick()

    def release(self, handle_id: str) -> None:
        """A decode engine read (or gave up) the KV under ``handle_id``: its blocks are free."""
        if self.scheduler.pull(handle_id) is not None:
            self._kick()

    # ---- the step loop ---------------------------------------------------------------------

    def _kick(self) -> None:
        """Step soon: at the end of this instant, so that what arrives at the same modelled
        time shares the step (as the live engine's loop task starts on the next turn)."""
        if not self._stepping:
            self._stepping = True
            self.events.at(self.events.now, self._step)

    def _step(self) -> None:
        sched, now = self.scheduler, self.events.now
        plan = sched.schedule()
        for seq in plan.kv_loads:
            self._pull(seq, now)
        inst = self.instance
        inst.running, inst.waiting = len(sched.running), len(sched.waiting)
        if plan.empty:
            self._stepping = False
            return
        self._stepping = True
        hops = self._hops
        for seq in plan.first_scheduled:
            hops[seq.seq_id].scheduled_at = now
        prefill, decode = plan.workload()
        s = self.shape
        took = step_duration(s.model, s.hardware, inst.tp, prefill, decode)
        self.busy_s += took
        self.steps += 1
        self.events.at(now + took, self._complete, plan)

    def _complete(self, plan: StepPlan) -> None:
        now = self.events.now
        result = self.scheduler.complete(plan, now)
        hops = self._hops
        for seq in result.tokens:
            hops[seq.seq_id].token(now)
        for seq in result.finished:
            hop = hops.pop(seq.seq_id)
            hop.finished_at = now
            hop.listener.finished(hop)
        self._step()

    # ---- KV from a prefill engine ----------------------------------------------------------

    def _pull(self, seq: Seq, now: float) -> None:
        hop = self._hops[seq.seq_id]
        assert hop.source is not None, f"{seq.seq_id}: remote KV without a source"
        source, handle_id = hop.source
        handle = source.scheduler.handles[handle_id]
        missing = max(0, len(handle.blocks) - seq.hit_blocks)
        s = self.shape
        hop.kv_bytes = missing * s.block_size * s.model.kv_bytes_per_token
        took = profiles.transfer_seconds(hop.kv_bytes, s.link)
        self.kv_bytes += hop.kv_bytes
        self.events.at(now + took, self._pulled, seq.seq_id, took)

    def _pulled(self, seq_id: str, took: float) -> None:
        hop = self._hops[seq_id]
        hop.kv_s = took
        assert hop.source is not None
        source, handle_id = hop.source
        source.release(handle_id)
        self.scheduler.kv_loaded(seq_id)
        self._kick()

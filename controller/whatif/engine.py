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

Runs of decode steps are one event: when every running sequence decodes, nothing waits, every
one has had its first token and none finishes for a while, the step times of the next steps
follow from the batch alone (contexts grow by one a step), so the engine schedules one event
at the end of the run. Anything that reaches the engine before then (a new request, a freed
handle) first applies the steps done by its time (``Scheduler.advance_decodes``: blocks taken
in the same order) and turns the step in progress back into an ordinary one. The results are
those of stepping one by one (``tests/unit/whatif/test_des.py``); only the router's view of
which prompt blocks the engine still caches can lag inside a run (decode tokens evict none
unless the pool must make room).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from controller.engines.sim.cost import step_duration
from controller.engines.sim.engine import capacity_blocks
from controller.engines.sim.scheduler import Scheduler, Seq, StepPlan
from controller.models import Instance
from controller.whatif.events import EventQueue
from pdctl_api import profiles

RUN_MIN_STEPS = 4  # shorter decode runs are stepped one by one


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
    push: bool = False  # the prefill writes the KV once this hop registered its blocks
    registered: bool = False  # push: its blocks are allocated and offered to the prefill
    writing: bool = False  # push: the write started
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
    fast: bool = True  # runs of decode steps as one event
    _hops: dict[str, Hop] = field(default_factory=dict)
    _stepping: bool = False  # a step runs or is due
    # a run of decode steps: its first step's plan, each step's end; the run's generation
    _run: tuple[StepPlan, list[float]] | None = None
    _generation: int = 0
    on_idle: Callable[[DesEngine], None] | None = None  # told when it next holds nothing

    def __post_init__(self) -> None:
        s = self.shape
        self.scheduler = Scheduler(
            capacity_blocks(s.model, s.hardware, self.instance.tp, s.block_size), s.block_size,
            s.max_num_seqs, s.max_num_batched_tokens)

    @property
    def idle(self) -> bool:
        """No request in it and no KV held for another engine."""
        return not self._hops and not self.scheduler.handles

    def _check_idle(self) -> None:
        if self.on_idle is not None and self.idle:
            self.on_idle(self)

    def submit(self, hop: Hop) -> None:
        if self._run is not None:
            self._split()
        hop.arrived = self.events.now
        self.scheduler.add(hop.seq)
        self._hops[hop.seq.seq_id] = hop
        self._kick()

    def release(self, handle_id: str) -> None:
        """A decode engine read (or gave up) the KV under ``handle_id``: its blocks are free."""
        if self._run is not None:
            self._split()
        if self.scheduler.pull(handle_id) is not None:
            self._kick()
        self._check_idle()

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
            hop = self._hops[seq.seq_id]
            if hop.push:
                hop.registered = True
                self._write(hop, now)
            else:
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
        run = self._run_length(plan, prefill) if self.fast else 0
        if run:
            self._start_run(plan, len(decode), sum(decode), now + took, run)
        else:
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
        self._check_idle()

    # ---- runs of decode steps ----------------------------------------------------------------

    def _run_length(self, plan: StepPlan, prefill: list[tuple[int, int]]) -> int:
        """Steps from this one the engine may take as one event (0: step by step)."""
        sched = self.scheduler
        if prefill or sched.waiting or len(plan.chunks) != len(sched.running):
            return 0
        steps = min(s.max_tokens - s.num_output for s in sched.running) - 1
        if steps < RUN_MIN_STEPS:
            return 0
        hops = self._hops
        if any(hops[s.seq_id].first_at is None for s in sched.running):
            return 0  # a first token tells the router something: at its own time
        if sched.decode_growth(steps) > sched.pool.free:
            return 0  # a step would preempt
        return steps

    def _start_run(self, plan: StepPlan, batch: int, context: int, first_end: float,
                   steps: int) -> None:
        s, tp = self.shape, self.instance.tp
        ends, t = [first_end], first_end
        for j in range(1, steps):
            t += profiles.batch_seconds(s.model, s.hardware, tp, 0, 0, batch,
                                        context + batch * j)
            ends.append(t)
        self._run = (plan, ends)
        self._generation += 1
        self.events.at(t, self._run_done, self._generation)

    def _run_done(self, generation: int) -> None:
        if generation != self._generation or self._run is None:
            return  # split before its end
        self._apply_run(len(self._run[1]))
        self._run = None
        self._step()

    def _apply_run(self, done: int) -> None:
        """The run's first ``done`` steps happened: tokens at their ends."""
        assert self._run is not None
        plan, ends = self._run
        sched, hops = self.scheduler, self._hops
        sched.complete(plan, ends[0])
        seqs = [seq for seq, _ in plan.chunks]
        for seq in seqs:
            hops[seq.seq_id].token(ends[0])
        if done > 1:
            sched.advance_decodes(done - 1)
            gaps = [ends[j] - ends[j - 1] for j in range(1, done)]
            for seq in seqs:
                hop = hops[seq.seq_id]
                if hop.gaps is not None:
                    hop.gaps.extend(gaps)
                hop.last_at = ends[done - 1]
            self.busy_s += ends[done - 1] - ends[0]

    def _split(self) -> None:
        """Something reaches the engine inside a run: the steps done by now happen, and the
        step in progress goes on as an ordinary step."""
        assert self._run is not None
        plan, ends = self._run
        now = self.events.now
        done = bisect.bisect_right(ends, now)
        self._generation += 1  # the run's own end event is void
        if done == 0:
            self._run = None
            self.events.at(ends[0], self._complete, plan)
            return
        self._apply_run(done)
        self._run = None
        if done == len(ends):
            self._step()
            return
        step = self.scheduler.schedule()  # what the engine planned at ends[done - 1]
        self.busy_s += ends[done] - ends[done - 1]
        self.events.at(ends[done], self._complete, step)

    # ---- KV from a prefill engine ----------------------------------------------------------

    def prefilled(self, seq_id: str) -> None:
        """Push: the prefill of the hop ``seq_id`` finished (its KV is held under the
        request's id): the write starts if the hop registered its blocks."""
        hop = self._hops.get(seq_id)
        if hop is not None:
            self._write(hop, self.events.now)

    def _write(self, hop: Hop, now: float) -> None:
        """Push: the prefill writes once both its KV and the registration are there; the
        write takes what a pull of the same blocks takes (the link's time for their bytes)."""
        assert hop.source is not None
        source, handle_id = hop.source
        if hop.registered and not hop.writing and handle_id in source.scheduler.handles:
            hop.writing = True
            self._pull(hop.seq, now)

    def _pull(self, seq: Seq, now: float) -> None:
        hop = self._hops[seq.seq_id]
        assert hop.source is not None, f"{seq.seq_id}: remote KV without a source"
        source, handle_id = hop.source
        handle = source.scheduler.handles[handle_id]
        missing = max(0, len(handle.blocks) - seq.hit_blocks)
        s = self.shape
        hop.kv_bytes = missing * s.block_size * s.model.kv_bytes_per_token
        took = profiles.transfer_seconds(hop.kv_bytes, s.link)
        self.events.at(now + took, self._pulled, seq.seq_id, took)

    def _pulled(self, seq_id: str, took: float) -> None:
        hop = self._hops[seq_id]
        hop.kv_s = took
        assert hop.source is not None
        source, handle_id = hop.source
        source.release(handle_id)
        self.scheduler.kv_loaded(seq_id)
        self._kick()

"""What a fault rehearsal's clients saw, judged: each request's outcome, and the checks the
rehearsal passes or fails, as data."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: An outcome's ``error`` starting with one of these is an error the client was told: an
#: HTTP error answer in OpenAI's shape, or an error event ending a stream.
CLEAR = ("http ", "stream error event")
HUNG = "hung"  # no answer within the client's timeout
REFUSED = "connect refused"  # no controller listening: nothing was taken


@dataclass(frozen=True)
class ClientOutcome:
    rid: str
    prompt: int  # the prompt's index
    latency_s: float
    text: str | None = None  # the completion, when it succeeded
    error: str | None = None  # what went wrong otherwise: "http 502: ...", "hung", ...
    answered: bool = True  # an HTTP answer came (the controller saw the request)
    sent_at: float = 0.0  # unix time it was sent


@dataclass(frozen=True)
class FaultCheck:
    name: str
    ok: bool
    detail: str


@dataclass
class Report:
    fault: str
    target: str
    detail: str
    started: float  # unix time the fault was injected
    checks: list[FaultCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(FaultCheck(name, ok, detail))


def served(outcomes: Sequence[ClientOutcome], refusals_ok: bool = False) -> FaultCheck:
    """Every request completed or got a clear error; none hung, none lost to a reset. With
    ``refusals_ok`` (the controller itself restarted) a refused connection is clear too: no
    controller was listening, so nothing was taken."""
    clear_kinds = (*CLEAR, REFUSED) if refusals_ok else CLEAR
    ok = sum(1 for o in outcomes if o.error is None)
    clear = Counter(o.error.split(":")[0] for o in outcomes
                    if o.error and o.error.startswith(clear_kinds))
    lost = Counter(o.error[:80] for o in outcomes
                   if o.error and not o.error.startswith(clear_kinds))
    told = ", ".join(f"{n} {k}" for k, n in sorted(clear.items()))
    detail = (f"{ok} of {len(outcomes)} completed"
              + (f"; clear errors: {told}" if told else "")
              + (f"; LOST: {dict(lost)}" if lost else ""))
    return FaultCheck("every request completed or got a clear error", not lost and ok > 0,
                      detail)


def same_answers(outcomes: Sequence[ClientOutcome], reference: Mapping[int, str]) -> FaultCheck:
    """Every completed answer equals its prompt's reference (temperature 0). A reference
    that gives every prompt the same answer could not tell one request's output from
    another's, so it fails too."""
    done = [o for o in outcomes if o.error is None]
    wrong = [o.rid for o in done if reference.get(o.prompt) != o.text]
    distinct = len(set(reference.values()))
    blind = len(reference) > 1 and distinct == 1
    return FaultCheck(
        "every answer is its prompt's reference (colocated, temperature 0)",
        not wrong and bool(done) and not blind,
        f"{len(done) - len(wrong)} of {len(done)} equal ({distinct} distinct references)"
        + (f"; DIFFER: {wrong[:5]}" if wrong else "")
        + ("; every prompt's reference is the same: it cannot tell answers apart"
           if blind else ""))


def recorded(outcomes: Sequence[ClientOutcome], missing: Sequence[str],
             paths: Mapping[str, int]) -> FaultCheck:
    """``paths``: how many of the records found were served on each path."""
    answered = sum(1 for o in outcomes if o.answered)
    served_on = ", ".join(f"{n} {k}" for k, n in sorted(paths.items()))
    return FaultCheck(
        "every answered request is in the controller's records", not missing,
        f"{answered - len(missing)} of {answered} found ({served_on or 'none'})"
        + (f"; MISSING: {list(missing)[:5]}" if missing else ""))


def nothing_held(held: Mapping[str, str]) -> FaultCheck:
    """``held``: instance -> what it still holds, once the lease has run out."""
    return FaultCheck(
        "nothing held on an engine afterwards", not held,
        "KV handles 0 and KV cache use 0 on every ready instance" if not held else
        "HELD: " + "; ".join(f"{k}: {v}" for k, v in sorted(held.items())))


def told(kinds: Sequence[str], expected: Sequence[str], target: str) -> FaultCheck:
    """The fault is in the audit log (the console's Events and incidents): one of
    ``expected`` event kinds about ``target`` since it was injected."""
    hit = [k for k in kinds if k in expected]
    return FaultCheck(
        "the fault is recorded (console events)", bool(hit),
        f"{', '.join(sorted(set(hit)))} on {target}" if hit else
        f"no {' or '.join(expected)} event on {target}; seen: "
        f"{', '.join(sorted(set(kinds))) or 'none'}")


def recovered(ready: bool, after_s: float, why: str) -> FaultCheck:
    return FaultCheck("the fleet can serve again (/readyz)", ready,
                      f"ready {after_s:.0f} s after the fault" if ready else why)


def full_disk_told(refused: str | None, problem: str | None, after: str | None
                   ) -> FaultCheck:
    """While the state disk was full an operator's change was refused with 503 (nothing
    changed, as it could not be recorded) and ``/cluster`` said why; once it had room, the
    same change was taken. ``refused``/``after``: the refusal, None when taken."""
    ok = bool(refused and refused.startswith("503") and problem) and after is None
    return FaultCheck(
        "the full disk is told and refuses changes while it lasts", ok,
        f"a change while full: {refused or 'TAKEN'}; /cluster state_problem: "
        f"{problem or 'NONE'}; the same change after: {after or 'taken'}")


#: The events that say a fault happened, per fault (fill-disk: none can be written while
#: it lasts; ``full_disk_told`` judges it).
EXPECTED_EVENTS: dict[str, tuple[str, ...]] = {
    "kill-prefill": ("instance.failed",),
    "kill-decode": ("instance.failed",),
    "stall-prefill": ("instance.failed", "kv.expired", "kv.after_expiry"),
    "tp-change": ("pool.update",),
    "restart-controller": ("controller.start",),
}


def render_report(report: Report) -> str:
    lines = [f"fault: {report.fault} on {report.target}: {report.detail}"]
    for c in report.checks:
        lines.append(f"  {'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}")
    lines.append("result: " + ("passed" if report.ok else "FAILED"))
    return "\n".join(lines)

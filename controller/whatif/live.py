"""The running controller's own fleet as a discrete-event run: its model (served context),
accelerator and KV link from the profiles, its routing settings, and its recent requests as
traffic. One place for the planner's look-ahead and the console's what-if."""

from __future__ import annotations

import math

from controller.config import RoutingSettings, Settings
from controller.replay.trace import TraceRequest, from_records
from controller.requests_log import RequestLog
from controller.whatif.engine import EngineShape
from controller.whatif.fleet import Goals
from controller.whatif.run import RunSpec
from pdctl_api import profiles

RECENT_RECORDS = 20_000  # the most recent requests played, at most


def live_spec(s: Settings, ttft_ms: float, routing: RoutingSettings | None = None
              ) -> RunSpec | str:
    """The run spec of ``s``'s fleet with ``ttft_ms`` as TTFT target and ``routing`` (the
    live routing settings; default the configured ones), or why there is none (a model,
    accelerator or link with no profile)."""
    names = ((profiles.MODELS, s.model.profile_name), (profiles.HARDWARE, s.hardware.accelerator),
             (profiles.LINKS, s.hardware.kv_link))
    missing = [name for table, name in names if name not in table]
    if missing:
        return f"no profile for {', '.join(missing)}"
    model = profiles.MODELS[s.model.profile_name]
    if s.model.max_model_len:
        model = profiles.with_context(model, min(s.model.max_model_len, model.max_model_len))
    return RunSpec(EngineShape(model, profiles.HARDWARE[s.hardware.accelerator],
                               profiles.LINKS[s.hardware.kv_link]),
                   routing or s.routing, Goals(ttft_ms, math.inf))


def recent_traffic(log: RequestLog, now: float, window_s: float, scale: float
                   ) -> list[TraceRequest]:
    """The requests received in the last ``window_s`` modelled seconds, as traffic."""
    return from_records(log.recent(RECENT_RECORDS, since=now - window_s * scale), scale)

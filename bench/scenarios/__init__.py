"""Every scenario, in the order the suite (``python -m bench``) runs them, then the measuring
tools it does not run. Each is a ``bench.scenario.Scenario``: a module or package of its own
here, named as on the command line."""

from __future__ import annotations

from typing import Any

from bench.scenario import Scenario
from bench.scenarios.cache import CacheScenario
from bench.scenarios.console import ConsoleScenario
from bench.scenarios.handoff import HandoffScenario
from bench.scenarios.lab import LabScenario
from bench.scenarios.measure_lab import MeasureLabTool
from bench.scenarios.nixl import NixlTool
from bench.scenarios.plan_check import PlanCheckTool
from bench.scenarios.plan_rules import PlanRulesTool
from bench.scenarios.planner import PlannerScenario
from bench.scenarios.ray_start import RayStartScenario
from bench.scenarios.rehearse import RehearseTool
from bench.scenarios.router import RouterScenario
from bench.scenarios.scale import ScaleScenario
from bench.scenarios.soak import SoakScenario
from bench.scenarios.whatif import WhatIfScenario

SCENARIOS: tuple[Scenario[Any, Any], ...] = (
    RouterScenario(), CacheScenario(), LabScenario(), ScaleScenario(), ConsoleScenario(),
    RayStartScenario(), PlannerScenario(), HandoffScenario(), SoakScenario(), WhatIfScenario(),
    NixlTool(), MeasureLabTool(), PlanRulesTool(), PlanCheckTool(), RehearseTool())

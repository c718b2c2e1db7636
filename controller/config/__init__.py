"""Settings: one YAML file plus ``PDCTL_<SECTION>__<FIELD>`` environment overrides.

Every field has a default. ``load_settings`` refuses a bad file with the field and the reason
(``ConfigError``). The pool sizes, TPs and routing values here are the *initial* desired state;
once the controller has run, the state directory's store holds the operator's changes.

``sections`` and ``engines`` hold the sections, ``settings`` the whole (``Settings``) and
what follows from it, ``load`` loading and live changes. The fields the control API changes
take their type, bounds and description from ``pdctl_api.schema``.
"""

from controller.config.engines import RaySettings, SimSettings, VllmSettings
from controller.config.load import (
    deep_merge,
    describe_validation_error,
    load_settings,
    patched,
    pools_problem,
)
from controller.config.sections import (
    ControllerSettings,
    HardwareSettings,
    KvSettings,
    ModelSettings,
    PlannerSettings,
    PoolSettings,
    PoolsSettings,
    PrometheusSettings,
    RoutingSettings,
    Strict,
    TargetsSettings,
)
from controller.config.settings import (
    DTYPE_BYTES,
    Settings,
    model_profile_for,
    profile_from_hf_config,
)
from pdctl_api.schema import PlannerMode

__all__ = [
    "DTYPE_BYTES", "ControllerSettings", "HardwareSettings", "KvSettings", "ModelSettings",
    "PlannerMode", "PlannerSettings", "PoolSettings", "PoolsSettings", "PrometheusSettings",
    "RaySettings", "RoutingSettings", "Settings", "SimSettings", "Strict", "TargetsSettings",
    "VllmSettings", "deep_merge", "describe_validation_error", "load_settings",
    "model_profile_for", "patched", "pools_problem", "profile_from_hf_config",
]

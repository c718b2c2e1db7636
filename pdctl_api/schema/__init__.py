"""The control API's contract (``/api/v1/*``, ``/healthz``): the JSON every route answers and
accepts, as pydantic models, and the enums they share. The controller declares its routes with
them, and the CLI and the console read the answers through them; nothing here knows how the
controller computes a value.

One module per resource: ``common`` (enums, the bases, the error shape), ``cluster`` (pools,
instances, the dry run of a pool change, health, access), ``routing``, ``requests`` (requests,
stats, time series), ``advisor``, ``planner``, ``targets``, ``events`` and ``utilization``
(each pool's and instance's load against its profiled capacity). A setting the API
changes (routing, targets, the planner's live settings, a pool's size and TP) has its type,
bounds and description written once, in its resource's module, as an ``Annotated`` type: the
answer declares the field with it, the PATCH body takes it from the answer
(``common.changes_of``), and the controller's configuration section uses the same type.

Fields an older controller does not send (``kv_integrity``, ``quarantine``, ``suspect``,
``kv_handle``, the lease counters in ``nixl``) have defaults, so a newer client still reads it.
"""

from pdctl_api.schema.advisor import (
    AdvisorPublic,
    Decision,
    FleetRatioPublic,
    KvCapacityPublic,
    KvTransferPublic,
    TrafficPublic,
    VerdictPublic,
)
from pdctl_api.schema.cache import (
    CacheBucket,
    CacheInstancePublic,
    CachePublic,
    CacheTokens,
    KvIndexPublic,
)
from pdctl_api.schema.cluster import (
    AccessPublic,
    ActionKind,
    ClusterPublic,
    HardwarePublic,
    HealthPublic,
    InstanceLogPublic,
    InstancePublic,
    LoadPublic,
    ModelPublic,
    NixlPublic,
    PlannedAction,
    PoolActual,
    PoolPlanPublic,
    PoolPublic,
    PoolSize,
    PoolUpdate,
    QuarantinePublic,
)
from pdctl_api.schema.common import ErrorPublic, InstanceState, Public, RequestPath, Role
from pdctl_api.schema.events import EventPublic
from pdctl_api.schema.planner import (
    PlanLoad,
    PlannerBounds,
    PlannerMode,
    PlannerPublic,
    PlannerUpdate,
    PlanObserved,
    PlanPublic,
    PredictorName,
    TpAdvicePublic,
)
from pdctl_api.schema.requests import (
    PARTS,
    AdmissionPublic,
    BucketPublic,
    Components,
    FallbackPairPublic,
    HandoffPublic,
    KvIntegrityPublic,
    KvWindowPublic,
    NixlTotals,
    PartsMean,
    PathStats,
    Percentiles,
    PoolUtilization,
    RequestPublic,
    StatsPublic,
    TailPublic,
    TimeseriesPublic,
    TransferShare,
    TtftBucket,
)
from pdctl_api.schema.routing import ROUTING_FIELDS, PolicyName, RoutingPublic, RoutingUpdate
from pdctl_api.schema.targets import TargetsPublic, TargetsUpdate
from pdctl_api.schema.utilization import (
    CapacityPublic,
    InstanceLoadPublic,
    LoadSeriesPublic,
    LoadSummaryPublic,
    PoolLoadPublic,
    RateClock,
    UtilizationPublic,
)
from pdctl_api.schema.whatif import (
    ComparisonPublic,
    FiguresPublic,
    ForecastPublic,
    LayoutPublic,
    PoolChoice,
    WhatIfPools,
    WhatIfPublic,
    WhatIfStatus,
)

__all__ = [
    "PARTS", "ROUTING_FIELDS", "CacheBucket", "CacheInstancePublic", "CachePublic",
    "CacheTokens", "KvIndexPublic", "AccessPublic", "ActionKind", "AdmissionPublic",
    "AdvisorPublic", "BucketPublic", "ClusterPublic", "Components", "Decision", "ErrorPublic",
    "EventPublic", "FleetRatioPublic", "HardwarePublic", "HealthPublic", "InstanceLogPublic",
    "InstancePublic", "InstanceState", "KvCapacityPublic", "KvIntegrityPublic",
    "FallbackPairPublic", "HandoffPublic",
    "KvTransferPublic", "KvWindowPublic", "LoadPublic", "ModelPublic", "NixlPublic",
    "NixlTotals", "PartsMean", "PathStats", "Percentiles", "PlanLoad", "PlanObserved",
    "PlanPublic", "PlannedAction", "PlannerBounds", "PlannerMode", "PlannerPublic",
    "PlannerUpdate", "PolicyName", "PoolActual", "PoolPlanPublic", "PoolPublic", "PoolSize",
    "PoolUpdate", "PoolUtilization", "PredictorName", "Public", "QuarantinePublic",
    "RequestPath", "RequestPublic", "Role", "RoutingPublic", "RoutingUpdate", "StatsPublic",
    "TailPublic", "TargetsPublic", "TargetsUpdate", "TimeseriesPublic", "TrafficPublic",
    "TransferShare", "TtftBucket", "VerdictPublic",
    # /utilization
    "CapacityPublic", "InstanceLoadPublic", "LoadSeriesPublic", "LoadSummaryPublic",
    "PoolLoadPublic", "RateClock", "UtilizationPublic", "TpAdvicePublic",
    # /whatif
    "ComparisonPublic", "FiguresPublic", "ForecastPublic", "LayoutPublic", "PoolChoice",
    "WhatIfPools", "WhatIfPublic", "WhatIfStatus",
]

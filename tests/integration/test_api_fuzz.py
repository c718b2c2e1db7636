"""Property-based fuzz of the control API from its own OpenAPI document (schemathesis), on
the wire against a real controller process with simulated engines: for every operation,
generated requests -- valid and invalid -- never get a server error, and every answer
matches what the document declares (status, headers, body schema)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.config import SchemathesisConfig
from schemathesis.generation.case import Case
from schemathesis.generation.modes import GenerationMode
from schemathesis.openapi.loaders import from_url
from schemathesis.schemas import APIOperation

from tests.integration.harness import ControllerProc, start_controller

EXAMPLES = 60  # per operation and mode (valid, invalid)
# Every check runs. A schema-valid request may still be refused with 422 when the cluster
# cannot take it (more accelerators than the hardware has, a TP beyond a node) or for a rule
# across fields a JSON schema cannot state (since before until, at most 2,000 buckets): the
# contract's "invalid -> 422 with the reason, nothing changed". Never for a rule the schema
# could state -- a type or a bound: pydantic's own words in the refusal say it was one.
SCHEMA_RULES = ("Input should", "Field required", "Extra inputs are not permitted")
def config(token: str) -> SchemathesisConfig:
    return SchemathesisConfig.from_dict({
        "auth": {"openapi": {"HTTPBearer": {"bearer": token}}},
        # 409: a valid what-if the fleet's state cannot answer (too few recent requests)
        "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "404", "409",
                                                                      "422"]}}})


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProc]:
    # Small hardware: a generated pool change that passes validation starts few engines.
    c = start_controller(tmp_path_factory.mktemp("fuzz"), {
        "model": {"name": "llama-3-8b"}, "hardware": {"accelerators_per_node": 4, "nodes": 1},
        "pools": {"prefill": {"size": 1, "tp": 1}, "decode": {"size": 1, "tp": 1}}})
    yield c
    c.stop()


def fuzz(op: APIOperation, mode: GenerationMode, seen: dict[str, set[int]]) -> None:
    """Hypothesis over one operation in one mode; the statuses answered go to ``seen``."""
    key = f"{op.label} ({mode.value})"

    @given(case=op.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case: Case) -> None:
        r = case.call_and_validate(timeout=30)
        seen.setdefault(key, set()).add(r.status_code)
        if mode is GenerationMode.POSITIVE and r.status_code == 422:
            detail = str(r.json().get("detail"))
            assert not any(rule in detail for rule in SCHEMA_RULES), (
                f"a request its schema calls valid was refused by a rule the schema could "
                f"state: {detail} ({case.path_parameters} {case.query} {case.body})")

    run()


def test_control_api_answers_as_documented(target: ControllerProc) -> None:
    schema = from_url(f"{target.url}/openapi.json", config=config(target.token)).include(
        path_regex="^/(api/v1|healthz)")
    failures: dict[str, str] = {}
    seen: dict[str, set[int]] = {}  # statuses answered, by operation and mode
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15, [op.label for op in operations]
    for op in operations:
        for mode in GenerationMode:
            try:
                fuzz(op, mode, seen)
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # nothing in the request to make invalid
            except (Exception, BaseExceptionGroup) as exc:  # every operation, then the report
                failures[f"{op.label} ({mode.value})"] = f"{type(exc).__name__}: {exc}"[:2000]
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    # Not vacuous: the token was sent (valid requests of every read got 200) and invalid
    # requests were refused.
    for op in operations:
        if op.method.upper() == "GET" and "{" not in op.path:
            assert 200 in seen[f"{op.label} (positive)"], (op.label, seen)
    refused = set().union(*(v for k, v in seen.items() if k.endswith("(negative)")))
    assert {401, 422} <= refused, seen

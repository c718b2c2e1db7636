"""Pool changes are checked against the model, the hardware and vLLM's NIXL TP rule."""

from __future__ import annotations

import pytest

from controller.errors import InvalidChange
from controller.models import PoolTarget, Role
from controller.sizing.fit import check_change
from pdctl_api import profiles

M70 = profiles.model("llama-3-70b")
H100 = profiles.hardware("h100-sxm")
BASE = {Role.PREFILL: PoolTarget(1, 4), Role.DECODE: PoolTarget(1, 2)}


def change(role: Role, size: int | None = None, tp: int | None = None, nodes: int = 4,
           managed: bool = True) -> dict[Role, PoolTarget]:
    return check_change(BASE, role, size, tp, model=M70, hw=H100, per_node=8, nodes=nodes,
                        managed=managed)


def test_default_lab_cluster_holds_4_prefill_and_8_decode() -> None:
    out = check_change({Role.PREFILL: PoolTarget(4, 4), Role.DECODE: PoolTarget(1, 2)},
                       Role.DECODE, 8, None, model=M70, hw=H100, per_node=8, nodes=4,
                       managed=True)
    assert out[Role.DECODE] == PoolTarget(8, 2)


@pytest.mark.parametrize(("role", "size", "tp", "needle"), [
    (Role.DECODE, None, 3, "does not divide"),
    (Role.DECODE, None, 16, "per node"),
    (Role.DECODE, None, 1, "needs"),  # 70B weights do not fit one H100
    (Role.DECODE, 0, None, "at least 1"),
    (Role.DECODE, 100, None, "accelerators"),
    (Role.PREFILL, None, None, "nothing to change"),
])
def test_invalid_changes_are_refused_with_a_reason(role: Role, size: int | None,
                                                   tp: int | None, needle: str) -> None:
    with pytest.raises(InvalidChange, match=needle):
        change(role, size, tp)


def test_nixl_hetero_tp_rule() -> None:
    m = profiles.ModelProfile("x", 8, 1024, 24, 24, 64, 2048, 1000, 1e8)
    with pytest.raises(InvalidChange, match="multiple"):
        check_change({Role.PREFILL: PoolTarget(1, 2), Role.DECODE: PoolTarget(1, 2)},
                     Role.DECODE, None, 3, model=m, hw=H100, per_node=8, nodes=1, managed=True)


def test_external_backend_cannot_be_resized() -> None:
    with pytest.raises(InvalidChange, match="external"):
        change(Role.DECODE, 2, managed=False)


def test_valid_change_returns_new_targets_and_leaves_input_alone() -> None:
    out = change(Role.DECODE, 3, 4)
    assert out[Role.DECODE] == PoolTarget(3, 4)
    assert BASE[Role.DECODE] == PoolTarget(1, 2)


def test_valid_tps_are_exactly_those_check_change_accepts() -> None:
    from controller.sizing.fit import valid_tps

    # 70B on H100: TP1 does not fit memory, 3/5/6/7 do not divide 64 heads and 8 KV heads.
    assert valid_tps(M70, H100, 8, Role.DECODE, other_tp=4) == [2, 4, 8]
    assert valid_tps(M70, H100, 4, Role.DECODE, other_tp=4) == [2, 4]  # within a node
    for tp in range(1, 9):
        try:
            change(Role.DECODE, tp=tp)
            accepted = True
        except InvalidChange:
            accepted = False
        assert accepted == (tp in valid_tps(M70, H100, 8, Role.DECODE, other_tp=4)), tp

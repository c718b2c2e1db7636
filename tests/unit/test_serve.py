"""``pdctl lab`` set-up decisions that need no processes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from controller.api import listener
from controller.cli import serve
from controller.cli.commands import build_parser


def test_lab_without_vllm_says_why_and_offers_sim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    args = build_parser().parse_args(["lab", "--state-dir", str(tmp_path)])
    assert args.run(args) == 2
    err = capsys.readouterr().err
    assert "vLLM is not installed" in err and "--backend sim" in err
    assert not (tmp_path / "token").exists()  # nothing was started


def test_cpu_lab_defaults(tmp_path: Path) -> None:
    args = build_parser().parse_args(["lab", "--state-dir", str(tmp_path), "--decode", "2",
                                      "--model-dir", str(tmp_path / "m")])
    s = serve.lab_settings(args)
    assert s.backend == "vllm" and s.hardware.accelerator == "cpu-lab"
    assert s.hardware.share == 2 and s.vllm.enforce_eager is True
    assert s.model.path == tmp_path / "m"
    assert s.kv_block_size == 128
    sim = serve.lab_settings(build_parser().parse_args(["lab", "--backend", "sim",
                                                        "--time-scale", "0.5"]))
    assert sim.model.name == "llama-3-70b" and sim.sim.time_scale == 0.5
    # The sim lab decodes at TP4 (TP2 holds ~35k tokens of KV per instance); a config file
    # keeps the configuration's own defaults.
    assert (sim.pools.prefill.tp, sim.pools.decode.tp) == (4, 4)
    cfg = tmp_path / "sim.yaml"
    cfg.write_text("backend: sim\n")
    own = serve.lab_settings(build_parser().parse_args(["lab", "--config", str(cfg)]))
    assert own.pools.decode.tp == 2


def test_the_controller_raises_its_open_file_limit_to_the_hard_one() -> None:
    import resource

    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft, hard = before
    if hard == resource.RLIM_INFINITY or hard < 256:
        pytest.skip(f"hard open-file limit {hard} leaves nothing to raise")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
        assert listener.raise_fd_limit() == (128, hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)

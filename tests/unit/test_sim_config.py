"""Configuration and command line of the simulated engine."""

from __future__ import annotations

import argparse

import pytest

from controller.engines.sim import (
    SimConfigError,
    SimEngineConfig,
    add_arguments,
    config_from_args,
    create_engine_app,
    run_from_args,
)
from controller.engines.sim.__main__ import main


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_map_onto_the_config() -> None:
    cfg = config_from_args(parse(
        "--port", "9001", "--role", "prefill", "--hardware", "h200", "--model", "llama-3-70b",
        "--served-model-name", "llama", "--tp", "4", "--link", "roce", "--time-scale", "0.05",
        "--kv-load-failure-policy", "recompute", "--max-num-seqs", "64",
        "--max-num-batched-tokens", "65536", "--kv-lease-duration", "12", "--block-size", "32",
        "--engine-id", "p0", "--startup-delay-s", "1.5"))
    assert cfg == SimEngineConfig(
        port=9001, role="prefill", hardware="h200", model="llama-3-70b",
        served_model_name="llama", tp=4, link="roce", time_scale=0.05,
        kv_load_failure_policy="recompute", max_num_seqs=64, max_num_batched_tokens=65536,
        kv_lease_duration_s=12.0, block_size=32, engine_id="p0", startup_delay_s=1.5)
    assert cfg.model_name == "llama"
    assert cfg.kv_heartbeat_interval_s == 2.0 and cfg.kv_lease_extension_s == 8.0


def test_defaults_follow_the_interface() -> None:
    cfg = config_from_args(parse("--port", "9001", "--tp", "2"))
    assert cfg == SimEngineConfig(port=9001, tp=2)
    assert cfg.kv_lease_duration_s == 30.0  # NixlConnector's default kv_lease_duration
    assert cfg.model_name == "llama-3-70b"


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--hardware", "tpu"], "unknown hardware 'tpu'; known: a100-80gb, cpu-lab, h100-sxm"),
    (["--model", "gpt"], "unknown model 'gpt'; known: lab-tiny, llama-3-70b, llama-3-8b"),
    (["--link", "wifi"], "unknown link 'wifi'; known: "),
    (["--tp", "0"], "tp must be >= 1"),
    (["--time-scale", "0"], "time_scale must be > 0"),
    (["--block-size", "0"], "block_size must be >= 1"),
    (["--kv-lease-duration", "0"], "kv_lease_duration_s must be > 0"),
    (["--kv-lease-duration", "-5"], "kv_lease_duration_s must be > 0"),
    (["--kv-lease-duration", "nan"], "kv_lease_duration_s must be > 0"),
    (["--kv-lease-duration", "inf"], "kv_lease_duration_s must be finite"),
    (["--tp", "1"], "llama-3-70b at TP=1 needs"),  # 70B does not fit one H100
])
def test_bad_values_are_named(argv: list[str], fragment: str) -> None:
    args = parse("--port", "9001", "--tp", "2", *argv)
    with pytest.raises(SimConfigError, match=fragment.replace("(", r"\(")):
        config_from_args(args)


def test_create_app_refuses_a_config_that_does_not_fit() -> None:
    with pytest.raises(SimConfigError, match="does not fit|needs"):
        create_engine_app(SimEngineConfig(port=1))


def test_run_from_args_returns_2_on_a_bad_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_from_args(parse("--port", "9001", "--model", "nope")) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err


def test_main_ignores_unmodelled_vllm_flags_out_loud(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--port", "9001", "--model", "nope", "--gpu-memory-utilization", "0.9"]) == 2
    err = capsys.readouterr().err
    assert "ignoring flags the simulator does not model: --gpu-memory-utilization 0.9" in err


def test_help_names_the_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--help")
    out = capsys.readouterr().out
    assert "h100-sxm" in out and "ib-ndr" in out and "--time-scale" in out


def test_the_old_ttl_flag_is_gone(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--port", "9001", "--kv-handle-ttl-s", "30")
    assert "--kv-handle-ttl-s" in capsys.readouterr().err

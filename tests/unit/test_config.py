"""Configuration: defaults, YAML, env overrides, and bad files refused with field + reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.config import load_settings, profile_from_hf_config
from controller.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "pdctl.yaml"
    p.write_text(text)
    return p


def test_defaults_are_the_domain_page_setup() -> None:
    s = load_settings()
    assert (s.model.name, s.hardware.accelerator) == ("llama-3-70b", "h100-sxm")
    assert (s.pools.prefill.tp, s.pools.decode.tp) == (4, 2)
    assert s.hardware.total_accelerators == 32


def test_yaml_file_and_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "routing:\n  disagg_min_prompt_tokens: 100\npools:\n  decode:\n"
                           "    size: 3\n")
    assert load_settings(path).pools.decode.size == 3
    monkeypatch.setenv("PDCTL_ROUTING__DISAGG_MIN_PROMPT_TOKENS", "42")
    assert load_settings(path).routing.disagg_min_prompt_tokens == 42


@pytest.mark.parametrize(("text", "needle"), [
    ("pools:\n  decode:\n    tp: 0\n", "pools.decode.tp"),
    ("routing:\n  nonsense: 1\n", "routing.nonsense"),
    ("hardware:\n  accelerator: tpu-v9\n", "unknown accelerator 'tpu-v9'"),
    ("model:\n  name: gpt-9\n", "unknown model profile"),
    ("backend: external\n", "pools.decode.urls"),
    ("- a\n- b\n", "mapping"),
    ("a: [\n", "not valid YAML"),
])
def test_bad_file_is_refused_with_field_and_reason(tmp_path: Path, text: str,
                                                   needle: str) -> None:
    with pytest.raises(ConfigError, match="pdctl.yaml") as err:
        load_settings(write(tmp_path, text))
    assert needle in str(err.value)


def test_external_backend_sizes_follow_urls(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, "backend: external\npools:\n  prefill: {urls: [http://a]}"
                                      "\n  decode: {urls: [http://b, http://c]}\n"))
    assert (s.pools.prefill.size, s.pools.decode.size) == (1, 2)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(Path("/nonexistent/pdctl.yaml"))


def test_profile_from_hf_config() -> None:
    m = profile_from_hf_config("tiny", {"hidden_size": 256, "num_attention_heads": 4,
                                        "num_key_value_heads": 2, "num_hidden_layers": 4,
                                        "intermediate_size": 512, "vocab_size": 640})
    assert m.kv_bytes_per_token == 2 * 4 * 2 * 64 * 2

"""``pdctl make-model``: offline, deterministic, and the profile the controller derives from
it matches the ``lab-tiny`` preset."""

from __future__ import annotations

from pathlib import Path

from controller.cli.make_model import is_model_dir, make_model
from controller.config import ModelSettings, model_profile_for
from controller.tokens import make_counter
from pdctl_api import profiles


def test_same_seed_same_files_and_matching_profile(tmp_path: Path) -> None:
    a, b = make_model(tmp_path / "a"), make_model(tmp_path / "b")
    assert is_model_dir(a)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    derived = model_profile_for(ModelSettings(name="lab-tiny", path=a))
    preset = profiles.model("lab-tiny")
    assert derived.kv_bytes_per_token == preset.kv_bytes_per_token
    assert derived.params == preset.params
    assert (derived.layers, derived.heads, derived.kv_heads) == (4, 4, 2)
    counter = make_counter(a)
    assert counter.count({"prompt": "prefill decode cache"}) < 10
    assert "tokenizer" in getattr(counter, "name", "")

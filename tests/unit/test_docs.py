"""The documented configuration reference is the code's defaults."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from controller.config import Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_reference_matches_defaults() -> None:
    block = re.search(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    assert block is not None
    documented = yaml.safe_load(block.group(1))
    defaults = Settings().model_dump(mode="json")
    assert documented == defaults

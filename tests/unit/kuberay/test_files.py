"""docker/kuberay/'s files themselves: each parses as one YAML document (a broken one is
caught), and the RayCluster's rayVersion is the Ray the GPU image installs."""

from __future__ import annotations

import re
import tomllib

import pytest
import yaml

from tests.unit.kuberay.manifests import (
    DOCKERFILE_GPU,
    EXPECTED_KINDS,
    ROOT,
    load,
    manifest_files,
    parse_one,
    raycluster,
)


def test_every_file_parses_as_one_yaml_document() -> None:
    files = manifest_files()
    assert {p.name for p in files} == set(EXPECTED_KINDS)
    for p in files:
        assert isinstance(parse_one(p.read_text(), p.name), dict)


def test_a_broken_file_is_caught() -> None:
    with pytest.raises(yaml.YAMLError):
        parse_one("kind: Service\nspec: {ports: [\n", "broken.yaml")
    with pytest.raises(AssertionError):
        parse_one("kind: A\n---\nkind: B\n", "two.yaml")


def test_ray_version_is_the_images() -> None:
    """The RayCluster's rayVersion (KubeRay picks its probes by it) is the Ray the GPU image
    installs: pdctl's ``ray`` extra, pinned in pyproject.toml."""
    assert re.search(r"pip install[^\n]*\.\[ray\]", DOCKERFILE_GPU.read_text())
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["ray"]
    pin = next(re.fullmatch(r"ray(?:\[[^\]]*\])?==([0-9.]+)", d) for d in extra
               if d.startswith("ray"))
    assert pin is not None
    assert raycluster(load())["spec"].get("rayVersion") == pin.group(1)

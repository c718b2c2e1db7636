"""The house's plan, checked from the code: every import points down the layers that
``docs/architecture.md`` draws, the console needs only the API package, no module grows past
450 lines, and ``controller/`` keeps at most a dozen loose modules at its top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("controller", "dashboard", "pdctl_api", "bench")

# Bottom to top: a module may import its own layer and the layers below it, never above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("pdctl_api",),
    ("controller.errors", "controller.models", "controller.tokens", "controller.token_file",
     "controller.store", "controller.requests_log", "controller.metrics", "controller.signals",
     "controller.vllm_metrics"),
    ("controller.kvevents",),
    ("controller.replay",),
    ("controller.sizing",),
    ("controller.config",),
    ("controller.engines",),
    ("controller.launchers",),
    ("controller.router",),
    ("controller.whatif",),
    ("controller.fleet",),
    ("controller.obs",),
    ("controller.planner",),
    ("controller.api",),
    ("controller.workers",),
    ("controller.faults",),
    ("controller.cli",),
)
MAX_LINES = 450
MAX_LOOSE = 12


def _modules(pkg: str) -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / pkg).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


def _imports(path: Path) -> set[str]:
    """Every module an import statement names, at any depth (TYPE_CHECKING and lazy ones
    included: an upward import is one wherever it stands)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return {n for n in names if n.split(".")[0] in PACKAGES}


def layer_of(module: str) -> int | None:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def _known(name: str, modules: set[str]) -> str | None:
    """The module an imported name is (``from pkg import mod`` names a module; ``from mod
    import func`` names the module)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


CONTROLLER = _modules("controller")
ALL = {m: p for pkg in PACKAGES for m, p in _modules(pkg).items()}


def test_every_controller_module_has_a_layer() -> None:
    assert [m for m in CONTROLLER if m != "controller" and layer_of(m) is None] == []


@pytest.mark.parametrize("module", sorted(m for m in ALL if m.startswith(("controller",
                                                                         "pdctl_api"))))
def test_no_upward_import(module: str) -> None:
    mine = layer_of(module)
    upward = []
    for name in _imports(ALL[module]):
        target = _known(name, set(ALL))
        if target is None or target == "controller":
            continue
        theirs = layer_of(target)
        if theirs is None or (mine is not None and theirs > mine):
            upward.append(target)
    assert sorted(upward) == [], f"{module} imports upward"


@pytest.mark.parametrize("module", sorted(m for m in ALL if m.startswith("dashboard")))
def test_the_console_imports_the_api_package_only(module: str) -> None:
    foreign = sorted(n for n in _imports(ALL[module]) if n.split(".")[0] in ("controller",
                                                                             "bench"))
    assert foreign == []


def test_no_module_over_450_lines() -> None:
    long = {str(p.relative_to(ROOT)): n
            for pkg in (*PACKAGES, "tests") for p in (ROOT / pkg).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_at_most_a_dozen_loose_modules_in_controller() -> None:
    loose = sorted(p.name for p in (ROOT / "controller").glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= MAX_LOOSE, loose

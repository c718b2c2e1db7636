"""One meaning per name: no top-level name is defined in two modules of the project's
packages (a name that means one thing is defined once and imported; two things get two
names). Entry points' ``main``, loggers and ``__all__`` are alike by design."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("controller", "dashboard", "pdctl_api", "bench")
ALIKE_BY_DESIGN = {"main", "log", "__all__"}


def _top_level_names(tree: ast.Module) -> list[str]:
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return names


def test_no_top_level_name_is_defined_twice() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for name in _top_level_names(ast.parse(path.read_text())):
                if name not in ALIKE_BY_DESIGN:
                    where[name].append(str(path.relative_to(ROOT)))
    twice = {name: files for name, files in where.items() if len(files) > 1}
    assert twice == {}

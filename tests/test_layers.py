"""The import layers of the project, read statically from the source (ast):
the one place the layer order is written down (docs/layout.md explains it).

Every import counts, at module level, inside a function, or under
``TYPE_CHECKING``: a reader follows each of them, and a circle of type-only
imports ties modules together as much as one that runs."""

from __future__ import annotations

import ast
import fnmatch
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The layers, bottom first. A module may import modules of its own unit and
#: of units on lower layers, never one on its own layer's other units or above.
#: A unit is a package with all it holds, or (``operators``, the public
#: package) one module alone.
LAYERS: list[list[str]] = [
    ["encoding"],
    ["statestore"],
    ["operators.errors"],
    # The contract types a user writes against, then the operator API.
    ["operators.typing"],
    ["operators._api"],
    # The built-in operators: each imports the operator API only.
    ["operators.join", "operators.dedup", "operators.aggregate", "operators.topn"],
    ["operators.examples"],
    # What runs operators, without Spark: the engine; the checkpoint files.
    ["operators._engine", "operators._checkpoint"],
    # The FK join is a two-stage pipeline; testing runs operators and pipelines.
    ["operators._fk_join", "operators.testing"],
    ["operators._spark"],
    ["operators._tools"],
    ["operators", "operators.cli"],
    # The bench sits on top: nothing in the library imports it.
    ["bench"],
]

#: Units that stand for their one module, not for the modules below them.
_ALONE = {"operators"}
PACKAGES = ("encoding", "statestore", "operators", "bench")


@dataclass(frozen=True)
class Import:
    """One import of a project module by another, where it is written."""

    source: str
    target: str
    file: Path
    line: int

    def __str__(self) -> str:
        where = self.file.relative_to(ROOT)
        return f"{where}:{self.line}: {self.source} imports {self.target}"


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Each module of the project packages under ``root``, by dotted name."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for file in sorted((root / package).rglob("*.py")):
            parts = list(file.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = file
    return found


def imports(found: dict[str, Path]) -> list[Import]:
    """Every import of one project module by another among ``found``, once
    per line."""
    return sorted(set(_imports(found)), key=str)


def _imports(found: dict[str, Path]) -> Iterator[Import]:
    """Every import of one project module by another, once per name imported."""
    for name, file in found.items():
        package = name if file.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                wanted = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                wanted = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in wanted:
                while target and target not in found:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    yield Import(name, target, file, node.lineno)


def unit_of(module: str) -> str | None:
    """The unit of LAYERS ``module`` belongs to (the longest that holds it)."""
    units = [
        u
        for layer in LAYERS
        for u in layer
        if module == u or (u not in _ALONE and module.startswith(u + "."))
    ]
    return max(units, key=len) if units else None


def layer_of(unit: str) -> int:
    """The layer of ``unit``, counted from the bottom."""
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def upward(edges: list[Import]) -> list[Import]:
    """The imports that run up a layer, or across to another unit of one layer."""
    wrong = []
    for edge in edges:
        source, target = unit_of(edge.source), unit_of(edge.target)
        if source is None or target is None or source == target:
            continue
        if layer_of(target) >= layer_of(source):
            wrong.append(edge)
    return wrong


def circles(edges: list[Import]) -> list[list[str]]:
    """The import circles: each set of modules that reach each other (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_has_a_layer() -> None:
    """Each module of the project belongs to a unit of LAYERS, so a new
    module's place in the layers is decided when it is added."""
    homeless = [m for m in modules() if unit_of(m) is None]
    assert not homeless, f"modules in no unit of LAYERS (tests/test_layers.py): {homeless}"


def test_no_import_runs_up_a_layer() -> None:
    """No module imports one of a higher layer, or of another unit of its
    own layer; in particular nothing of the library imports the bench."""
    wrong = upward(imports(modules()))
    assert not wrong, "imports that run up a layer:\n" + "\n".join(map(str, wrong))


def test_no_import_circles() -> None:
    """No two modules import each other, directly or through others."""
    edges = imports(modules())
    found = circles(edges)
    ties = [str(e) for circle in found for e in edges if e.source in circle and e.target in circle]
    assert not found, f"import circles {found}, tied by:\n" + "\n".join(ties)


def test_the_wheel_leaves_the_bench_out() -> None:
    """The wheel's packages (pyproject's find patterns) take every package of
    the library and none of ``bench``."""
    found = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = found["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {m for m, f in modules().items() if f.name == "__init__.py"}

    def shipped(package: str) -> bool:
        return any(fnmatch.fnmatchcase(package, p) for p in patterns)

    assert [p for p in packages if p.split(".")[0] == "bench" and shipped(p)] == []
    assert [p for p in packages if p.split(".")[0] != "bench" and not shipped(p)] == []

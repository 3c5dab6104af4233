"""The engine's stages stay layered: read every module's imports with `ast` and hold them to the map.

A module may import from its own layer or a lower one, never a higher one; only `engine/store/` imports
duckdb, only `engine/llm/` imports openai, only `studio/`, `pages/` and `streamlit_app.py` import streamlit;
and no two modules import each other in a circle. Imports under `if TYPE_CHECKING:` are left out (they never
run). The checks are functions over a {module: source} map, so the tests below also show they catch a
forbidden import and a circle planted in a copy of the real map.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A module's layer is that of the longest prefix listed here.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("engine", "engine.domain", "engine.events", "engine.text_views", "engine.atomic", "engine.markdown"),
    ("engine.store",),
    ("engine.ingest", "engine.sandbox", "engine.llm", "engine.embed", "engine.metrics", "engine.specs"),
    ("engine.apply",),
    ("engine.agents", "engine.gate", "engine.expert.explain", "engine.aggregators", "engine.pseudo_labels",
     "engine.weak_spots"),
    ("engine.evolve", "engine.labeling", "engine.expert", "engine.export"),
    ("engine.corpus",),
    ("engine.jobs",),
    ("engine.cli",),
    ("studio",),
    ("pages", "streamlit_app"),
)
ONLY_IMPORTED_BY = {"duckdb": ("engine.store",), "openai": ("engine.llm",), "ray": ("engine.corpus.engines",),
                    "streamlit": ("studio", "pages", "streamlit_app")}


def project_sources() -> dict[str, str]:
    """{dotted module name: source} of every module of the app (tests and bench are not part of it)."""
    paths = [*ROOT.glob("engine/**/*.py"), *ROOT.glob("studio/*.py"), *ROOT.glob("pages/*.py"),
             ROOT / "streamlit_app.py"]
    out = {}
    for path in paths:
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path.read_text(encoding="utf-8")
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_names(source: str) -> set[str]:
    """Every dotted name a module imports at run time (`from a.b import c` gives a.b and a.b.c)."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return names


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (a name that is an attribute maps to its module)."""
    graph: dict[str, set[str]] = {}
    for module, source in sources.items():
        targets = set()
        for name in imported_names(source):
            while name and name not in sources:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):  # a package's own face
                targets.add(name)
        graph[module] = targets
    return graph


def layer_of(module: str) -> int:
    best, depth = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and prefix.count(".") > depth:
                best, depth = index, prefix.count(".")
    if best < 0:
        raise AssertionError(f"{module} is in no layer of LAYERS: give it one")
    return best


def upward_imports(sources: dict[str, str]) -> list[str]:
    return sorted(f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
                  for module, targets in import_graph(sources).items() for target in targets
                  if layer_of(target) > layer_of(module))


def forbidden_imports(sources: dict[str, str]) -> list[str]:
    problems = []
    for module, source in sources.items():
        for name in imported_names(source):
            top = name.split(".")[0]
            owners = ONLY_IMPORTED_BY.get(top)
            if owners and not any(module == o or module.startswith(o + ".") for o in owners):
                problems.append(f"{module} imports {top} (only {', '.join(owners)} may)")
    return sorted(set(problems))


def circles(sources: dict[str, str]) -> list[list[str]]:
    """Strongly connected groups of two or more modules (Tarjan)."""
    graph = import_graph(sources)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strongconnect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                strongconnect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            strongconnect(node)
    return found


def test_no_module_imports_a_higher_stage():
    assert upward_imports(project_sources()) == []


def test_duckdb_openai_and_streamlit_each_have_one_home():
    assert forbidden_imports(project_sources()) == []


def test_no_import_circles():
    assert circles(project_sources()) == []


def test_every_module_has_a_layer():
    for module in project_sources():
        layer_of(module)


def test_the_checks_catch_a_planted_upward_import_a_stray_duckdb_and_a_circle():
    sources = project_sources()
    planted = dict(sources)
    planted["engine.store.workspace"] += "\nfrom engine.evolve import evolve\n"
    planted["engine.gate"] += "\nimport duckdb\n"
    planted["engine.metrics.score"] += "\nfrom engine.gate import run_gate\n"  # gate already imports score
    upward = upward_imports(planted)
    assert "engine.store.workspace (layer 1) imports engine.evolve (layer 5)" in upward
    assert "engine.gate imports duckdb (only engine.store may)" in forbidden_imports(planted)
    assert ["engine.gate", "engine.metrics.score"] in circles(planted)


def test_type_checking_imports_are_not_counted():
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.evolve import evolve\n"
    assert "engine.evolve" not in imported_names(source)

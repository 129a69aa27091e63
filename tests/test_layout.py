"""The package's shape stays as docs/ARCHITECTURE.md describes it: no import
cycle between lite_push modules, no module over 600 lines, no class within 10 % of 400.

Imports are read with ``ast``, wherever they are: a lazy import inside a
function is still a dependency, and so is one under ``if TYPE_CHECKING:``
(a module that names another's types for the type checker depends on it as
much as one that calls it; a cycle hidden there is a cycle still).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "lite_push"
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 400
#: A class this long is split before it grows: none is within 10 % of the cap.
CLASS_MARGIN_LINES = 360

def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


#: The compiled kernels (``_ext/<name>.pyx`` -> ``lite_push.<name>``): leaves
#: of the graph, whether built or not.
COMPILED = {f"lite_push.{p.stem}" for p in (PACKAGE.parent / "_ext").glob("*.pyx")}


def _imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import of the module, at any depth (``TYPE_CHECKING`` blocks
    included)."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the lite_push modules it imports."""
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        package = name if is_pkg else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base_parts = package.split(".")
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                # "from . import x" may name a submodule; else the module itself
                targets = []
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if sub in COMPILED:
                        continue
                    targets.append(sub if sub in mods else base)
            for t in targets:
                if t in COMPILED:
                    continue
                while t and t not in mods:  # "lite_push.sources.x.Y" -> the module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.add(t)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def strong(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_type_checking_imports_are_edges() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .b import B\n"
        "def f() -> None:\n"
        "    import lite_push.c\n"
    )
    assert [getattr(n, "module", None) or n.names[0].name for n in _imports(tree)] == ["typing", "b", "lite_push.c"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_lite_push_modules() -> None:
    mods = modules()
    graph = import_graph(mods)
    # the graph is real: the facade imports its parts
    assert "lite_push._consumer_core" in graph["lite_push._consumer"]
    assert "lite_push._wiring" in graph["lite_push._consumer_core"]
    assert "lite_push._pull_loop" in graph["lite_push._wiring"]
    assert cycles(graph) == []


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def test_no_module_over_600_lines() -> None:
    long = {
        _rel(p): n
        for p in modules().values()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    # a module that grows past the limit is split by concern in the same change
    assert long == {}


def test_no_class_within_ten_percent_of_the_400_line_cap() -> None:
    assert CLASS_MARGIN_LINES == MAX_CLASS_LINES * 9 // 10
    big = {}
    for p in modules().values():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                n = node.end_lineno - node.lineno + 1
                if n > CLASS_MARGIN_LINES:
                    big[f"{_rel(p)}:{node.name}"] = n
    assert big == {}

"""The package's shape stays as docs/ARCHITECTURE.md describes it: no import
cycle between lite_push modules, no module over 600 lines, no class over
400, no part of the runtime built with more than 8 collaborators, and each
package imports only what its role allows.

Imports are read with ``ast``, wherever they are: a lazy import inside a
function is still a dependency, and so is one under ``if TYPE_CHECKING:``
(a module that names another's types for the type checker depends on it as
much as one that calls it; a cycle hidden there is a cycle still).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "lite_push"
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 400


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


#: The compiled kernels (``_ext/<name>.pyx`` -> ``lite_push._kernels.<name>``):
#: leaves of the graph, whether built or not.
COMPILED = {f"lite_push._kernels.{p.stem}" for p in (PACKAGE.parent / "_ext").glob("*.pyx")}


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
    assert "lite_push._core.consumer_core" in graph["lite_push._consumer"]
    assert "lite_push._core.wiring" in graph["lite_push._core.consumer_core"]
    assert "lite_push._pull.loop" in graph["lite_push._core.wiring"]
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


def test_no_class_over_the_400_line_cap() -> None:
    big = {}
    for p in modules().values():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                n = node.end_lineno - node.lineno + 1
                if n > MAX_CLASS_LINES:
                    big[f"{_rel(p)}:{node.name}"] = n
    assert big == {}


# --- collaborators ----------------------------------------------------------------

#: A part of the runtime is built with at most this many collaborators (its
#: constructor's parameters, or its fields for a dataclass): a part that needs
#: more does more than one thing, and is split by concern.
MAX_COLLABORATORS = 8
#: The runtime's packages, whose classes are parts.
RUNTIME = ("_core", "_pull", "_lanes", "_state", "_exec")
#: Values, not parts: what a consumer reports and what building it returns.
VALUES = {"ConsumerStats", "ConsumerMetrics", "QueueStop", "StopReport", "Parts"}


def init_of(cls: ast.ClassDef) -> ast.FunctionDef | None:
    """The class's own ``__init__``, if it defines one."""
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)


def params(init: ast.FunctionDef) -> int:
    """A constructor's parameters, ``self`` aside."""
    a = init.args
    return len(a.posonlyargs) + len(a.args) - 1 + len(a.kwonlyargs)


def collaborators(tree: ast.Module) -> dict[str, int]:
    """Each class of ``tree``: its constructor's parameters (``self`` aside),
    or, for a dataclass without one, its fields."""
    out: dict[str, int] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        init = init_of(node)
        if init is not None:
            out[node.name] = params(init)
        elif any("dataclass" in ast.unparse(d) for d in node.decorator_list):
            out[node.name] = sum(isinstance(n, ast.AnnAssign) for n in node.body)
    return out


def runtime_parts() -> dict[str, int]:
    parts: dict[str, int] = {}
    for name, path in modules().items():
        if name.split(".")[1:2] and name.split(".")[1] in RUNTIME:
            parts.update(collaborators(ast.parse(path.read_text(encoding="utf-8"))))
    return {k: v for k, v in parts.items() if k not in VALUES}


#: Public classes built with options, as Kafka's and RocketMQ's clients are:
#: their identity and at most one more positional parameter, then settings,
#: each a keyword with a default (checked below), not collaborators.
TAKE_OPTIONS = {"KafkaBroker", "RedisBroker", "EmbeddedPullConsumer", "RedisPullConsumer", "ProcessSupervisor"}


def constructors() -> dict[str, ast.FunctionDef]:
    """Every class of ``lite_push`` with its own ``__init__``."""
    out: dict[str, ast.FunctionDef] = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and (init := init_of(node)) is not None:
                out[f"{name}.{node.name}"] = init
    return out


def test_no_part_of_the_runtime_takes_more_than_8_collaborators() -> None:
    over = {k: v for k, v in runtime_parts().items() if v > MAX_COLLABORATORS}
    assert over == {}, f"more than {MAX_COLLABORATORS} collaborators: split by concern"


def test_no_class_of_the_sources_cli_or_supervisor_either_but_public_ones_taking_options() -> None:
    over = {}
    for name, init in constructors().items():
        a = init.args
        n = params(init)
        if n <= MAX_COLLABORATORS:
            continue
        if name.rsplit(".", 1)[1] in TAKE_OPTIONS:
            assert len(a.args) - 1 <= MAX_POSITIONAL, f"{name}: its options are keywords"
            assert None not in a.kw_defaults, f"{name}: every option has a default"
            continue
        over[name] = n
    assert over == {}, f"more than {MAX_COLLABORATORS} collaborators: split by concern"


#: Positional parameters a part's constructor may take (its identity and at
#: most one more: ``Lane(index, wake)``); the rest are keywords.
MAX_POSITIONAL = 2
#: The timer's and the parks' records are values built in one place each.
POSITIONAL_ALLOWED = {"Parked", "DueKey", "KeyPauseChange"}


def test_the_runtime_s_parts_are_built_with_keywords() -> None:
    positional = {}
    for name, path in modules().items():
        if name.split(".")[1:2] and name.split(".")[1] in RUNTIME:
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef) and node.name not in POSITIONAL_ALLOWED:
                    init = init_of(node)
                    if init is not None and len(init.args.args) - 1 > MAX_POSITIONAL:
                        positional[node.name] = len(init.args.args) - 1
    assert positional == {}, "constructors that take more than two positional parameters: make the rest keywords"


def test_collaborators_are_counted_as_a_reader_counts_them() -> None:
    tree = ast.parse(
        "class A:\n    def __init__(self, a, b, *, c): ...\n"
        "@dataclass\nclass B:\n    x: int\n    y: int = 0\n"
        "class C:\n    pass\n"
    )
    assert collaborators(tree) == {"A": 3, "B": 2}
    assert runtime_parts()["PullLoop"] == 8  # config, source, clock, timer, intake, upkeep, latch, stopping


# --- packages by role -------------------------------------------------------------

#: The root's own modules: the public API and the base every package may use.
MAX_ROOT_MODULES = 15
#: The root's base modules: any package may import them.
BASE = {"_types", "_errors", "_config", "_clock", "_version", "_tracing"}
#: What each package may import besides the base.  ``sources.contract`` is the
#: source contract (``contract`` and ``retry_topics``); ``sources`` is every concrete source (and the package
#: itself).  Packages not listed (the consumers at the root, ``cli``,
#: ``testing``, ``demo``) sit on top and may import anything.  A new edge is a
#: decision: add it here, with its reason when it points up the data path.
MAY_IMPORT: dict[str, set[str]] = {
    "_kernels": set(),
    # up: the timer holds a lane's steps and its failed sends
    "_state": {"_kernels", "_lanes"},
    "_lanes": {"_kernels", "_state", "dlq", "sources.contract"},
    "_exec": {"_kernels", "_state", "_lanes"},
    "_pull": {"_kernels", "_state", "_lanes", "_exec", "sources.contract"},
    "_core": {"_kernels", "_state", "_lanes", "_exec", "_pull", "metrics", "sources.contract"},
    "dlq": {"sources.contract"},
    "rebalance": set(),
    "sources.contract": set(),
    # concrete sources: the contract, the kernels and the offset map, never the runtime
    "sources": {"sources.contract", "_kernels", "_state", "rebalance", "testing"},
    # the collector reads the consumer's snapshots; the supervisor's endpoint merges its members'
    "metrics": {"_core", "_kernels", "supervisor"},
    "supervisor": {"_core", "_state", "metrics", "root"},
}


def package_of(module: str) -> str:
    """The role a module belongs to: its package under ``lite_push``
    (``sources.contract`` apart from the concrete sources), ``base`` for the
    root's base modules, ``root`` for the root's other modules."""
    parts = module.split(".")[1:]
    if not parts:
        return "root"
    if parts[0] == "sources":
        return "sources.contract" if parts[1:2] in (["contract"], ["retry_topics"]) else "sources"
    if len(parts) == 1 and (PACKAGE / f"{parts[0]}.py").exists():
        return "base" if parts[0] in BASE else "root"
    return parts[0]


def test_the_root_holds_the_public_api_and_packages() -> None:
    own = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(own) <= MAX_ROOT_MODULES, own
    assert {f"{b}.py" for b in BASE} <= set(own)


def test_each_package_imports_only_what_its_role_allows() -> None:
    graph = import_graph(modules())
    wrong = sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        for t in targets
        if (src := package_of(m)) in MAY_IMPORT
        and (dst := package_of(t)) not in ("base", src)
        and dst not in MAY_IMPORT[src]
    )
    assert wrong == [], "imports across roles that MAY_IMPORT does not allow"


def test_the_role_check_sees_a_forbidden_import() -> None:
    assert package_of("lite_push._pull.loop") == "_pull"
    assert package_of("lite_push.sources.redis.broker") == "sources"
    assert package_of("lite_push.sources.contract") == "sources.contract"
    assert package_of("lite_push._types") == "base" and package_of("lite_push._consumer") == "root"
    assert "sources" not in MAY_IMPORT["_pull"]  # the core never imports a concrete source


def test_the_source_contract_imports_no_concrete_source() -> None:
    """``import lite_push.sources.contract`` (and ``import lite_push``)
    loads no source: the embedded broker's names are imported on first use."""
    code = (
        "import sys, lite_push, lite_push.sources.contract\n"
        "print(sorted(m for m in sys.modules if m.startswith('lite_push.sources.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = out.strip()
    assert loaded == "['lite_push.sources.contract', 'lite_push.sources.group_admin', 'lite_push.sources.retry_topics']"

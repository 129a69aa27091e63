"""docs/ARCHITECTURE.md says only what is true of the code.

* Every code span of the document that is a path (``lite_push/_pull/loop.py``,
  ``sources/redis/reading.py``, ``_ext/router_c.pyx``) must be a file of the
  repository, and every one that is a Python name (``Dispatcher``,
  ``PullLoop.run``, ``poll(timeout, max)``, ``revoke_timeout``) must be
  defined in the package: a module, class, function, method, attribute,
  parameter or constant of that name.  A rename that leaves the document
  behind fails here.
* Every number the document states about the code stands next to its
  constant (``MAX_SEGMENT`` (8), ``REVOKE_SLICE`` (50 ms), names in
  backticks) and equals it: the constant is found by name in the package
  (a module-level assignment or a class attribute) and read with
  ``ast.literal_eval``, or from the imported module.  A number with a unit
  that stands next to no constant fails too.
* The table ``| part | built alone in |`` is true: each test file it names
  calls each part's constructor, and no test builds a part it says none does.
* The document is short (``LINE_LIMIT``) and its table cells too.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGE = ROOT / "lite_push"

#: Names the document uses that are not lite_push's own: the standard
#: library's and other projects' (each checked to be spelled as there).
FOREIGN = {
    "time.sleep": "the standard library",
    "time.monotonic": "the standard library",
    "time.time": "the standard library",
    "ConsumeMessageOrderlyService": "RocketMQ's Java client (the class the baseline models)",
    "CancelledError": "asyncio",
    "KeyboardInterrupt": "builtins",
    "SystemExit": "builtins",
    "await": "a keyword",
    "TYPE_CHECKING": "typing",
    "sigtimedwait": "the standard library's signal module",
    "asyncio.sleep": "the standard library",
    "None": "builtins",
    "Consumer": "confluent-kafka",
    "Message": "confluent-kafka",
    "dlopen": "the C library",
}

_SPAN = re.compile(r"`([^`\n]+)`")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_CALL = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)\(.*\)$")
_PATH = re.compile(r"^[\w./-]+\.(py|pyx|md|json|toml|sh)$")


def _defined_names() -> set[str]:
    """Every name the package defines, at any depth."""
    names: set[str] = {PACKAGE.name}
    for path in PACKAGE.rglob("*.py"):
        names.add(path.parent.name if path.stem == "__init__" else path.stem)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    for path in (ROOT / "_ext").glob("*.pyx"):
        names.add(path.stem)
    return names


def _spans() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks are examples, not references
    return _SPAN.findall(text)


def _path_exists(span: str) -> bool:
    for base in (ROOT, PACKAGE):
        if (base / span).exists():
            return True
    if "/" not in span:  # "reading.py" next to the source it belongs to
        return any(PACKAGE.rglob(span))
    return False


def test_the_document_names_only_files_that_exist() -> None:
    paths = [s for s in _spans() if _PATH.match(s)]
    assert len(paths) > 40  # the document is read: it names the modules
    missing = sorted({p for p in paths if not _path_exists(p)})
    assert missing == [], f"docs/ARCHITECTURE.md names files that do not exist: {missing}"


def test_the_document_names_only_code_that_exists() -> None:
    defined = _defined_names()
    checked: set[str] = set()
    missing: set[str] = set()
    for span in _spans():
        call = _CALL.match(span)
        name = call.group(1) if call else span
        if not _NAME.match(name) or name in FOREIGN or _PATH.match(span):
            continue
        checked.add(name)
        if not all(part in defined for part in name.split(".")):
            missing.add(name)
    for name in ("Dispatcher.route_pending", "FailurePolicy", "RetryTimer", "build_parts", "CallGate.may_call"):
        assert name in checked  # the check sees the names it is meant to
    assert sorted(missing) == [], f"docs/ARCHITECTURE.md names code that does not exist: {sorted(missing)}"


def test_the_check_catches_a_name_that_is_gone() -> None:
    defined = _defined_names()
    assert "PullLoop" in defined and "Runtime" not in defined
    assert not _path_exists("lite_push/_runtime.py")


#: The longest a table cell of the document may be (characters of its
#: markdown): a cell says one phrase; the explanation is prose below the table.
CELL_LIMIT = 120


def _table_cells(text: str) -> list[tuple[int, str]]:
    """``(line number, cell)`` of every table row of ``text`` (outside code
    blocks), the header rows included and the ``|---|`` rules left out."""
    cells: list[tuple[int, str]] = []
    in_code = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("|") or re.fullmatch(r"[|\s:-]+", line):
            continue
        cells.extend((number, cell.strip()) for cell in line.strip().strip("|").split("|"))
    return cells


def test_every_table_cell_is_short() -> None:
    cells = _table_cells(DOC.read_text(encoding="utf-8"))
    assert len(cells) > 150  # the document's tables are read
    long = [f"line {n}: {len(c)} characters: {c[:60]}..." for n, c in cells if len(c) > CELL_LIMIT]
    assert long == [], f"docs/ARCHITECTURE.md has table cells over {CELL_LIMIT} characters:\n" + "\n".join(long)


def test_the_cell_check_reads_tables_only() -> None:
    text = "| a | b |\n|---|:-:|\n| `x` | " + "y" * 130 + " |\n\n```\n| not | a table |\n```\nprose | too\n"
    assert [(n, len(c)) for n, c in _table_cells(text)] == [(1, 1), (1, 1), (3, 3), (3, 130)]


# -- the page's length -------------------------------------------------------------------

#: The most lines the document may have: it is the map, the detail is in the
#: modules' docstrings and the user's pages of docs/.
LINE_LIMIT = 350


def test_the_document_is_short() -> None:
    lines = len(DOC.read_text(encoding="utf-8").splitlines())
    assert lines <= LINE_LIMIT, f"docs/ARCHITECTURE.md has {lines} lines; at most {LINE_LIMIT}"


# -- numbers: each stated next to its constant, and equal to it -------------------------

#: A number as the document writes it: ``4,096``, ``0.05``, ``8``.
_NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
#: What a unit after the number means: the constant is the number times this.
_UNITS = {"s": 1.0, "ms": 0.001, "KiB": 1024.0, "MiB": 1024.0 * 1024.0}
_UNIT = r"(?:ms|s|KiB|MiB)\b"
#: A number next to its constant: ``MAX_SEGMENT`` (8), ``REVOKE_SLICE`` (50 ms),
#: ``ConsumerConfig.commit_interval`` (5.0 s), or ``STEAL_MULTIPLE`` = 10, each
#: name in backticks.  A name may be qualified by its class
#: (``ConsumerConfig.max_span``) or by the end of its module's dotted name
#: (``kafka.consumer.WAIT_SLICE``).
_STATED = re.compile(
    rf"`(?P<name>[A-Za-z_][\w.]*)`\s+"  # a line may break between the name and its number
    rf"(?:\((?P<a>{_NUMBER})(?:\s(?P<ua>{_UNIT}))?\)|=\s+(?P<b>{_NUMBER})(?:\s(?P<ub>{_UNIT}))?)"
)
#: A number with a unit that is not next to its constant.
_LOOSE = re.compile(rf"(?<![\w.]){_NUMBER}\s?(?:ms|s|seconds|KiB|MiB|bytes|messages|lanes|threads)\b")

#: Where a constant is assigned: (module, class or None, value expression).
Definition = tuple[str, str | None, ast.expr]


def _prose(text: str) -> str:
    """``text`` without its code blocks (examples, not statements)."""
    return re.sub(r"```.*?```", "", text, flags=re.S)


def _assigned(node: ast.stmt) -> list[tuple[str, ast.expr]]:
    """``(name, value)`` of a plain or annotated assignment to a name."""
    if isinstance(node, ast.Assign):
        return [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
        return [(node.target.id, node.value)]
    return []


def _definitions() -> dict[str, list[Definition]]:
    """Every module-level assignment and class attribute of the package, by name."""
    found: dict[str, list[Definition]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        module = ".".join(parts)
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            for name, value in _assigned(node):
                found.setdefault(name, []).append((module, None, value))
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    for name, value in _assigned(stmt):
                        found.setdefault(name, []).append((module, node.name, value))
    return found


def _value(name: str, where: Definition) -> object:
    """The constant's value: its literal, else read from the imported module
    (a dataclass field's default, a class attribute, a module's global)."""
    module, owner, expr = where
    try:
        return ast.literal_eval(expr)
    except (ValueError, TypeError, SyntaxError):
        pass
    space = importlib.import_module(module)
    if owner is None:
        return getattr(space, name)
    cls = getattr(space, owner)
    if dataclasses.is_dataclass(cls):
        for field in dataclasses.fields(cls):
            if field.name == name:
                return field.default_factory() if field.default is dataclasses.MISSING else field.default
    return getattr(cls, name)


def _stated_problems(text: str) -> tuple[set[str], list[str]]:
    """The constants ``text`` states a number of, and what is wrong with each
    statement (a name that is not a constant, or names several with
    different values, or a number that is not the constant's)."""
    definitions = _definitions()
    names: set[str] = set()
    problems: list[str] = []
    for m in _STATED.finditer(_prose(text)):
        name = m["name"]
        names.add(name)
        number = float((m["a"] or m["b"]).replace(",", "")) * _UNITS.get(m["ua"] or m["ub"] or "s", 1.0)
        qualifier, _, attr = name.rpartition(".")
        where = [
            d
            for d in definitions.get(attr, [])
            if not qualifier or d[1] == qualifier or (d[1] is None and f".{d[0]}".endswith(f".{qualifier}"))
        ]
        if not where:
            problems.append(f"{m[0]!r}: {name} is not a constant of lite_push/")
            continue
        values = [_value(attr, d) for d in where]
        if any(v != values[0] for v in values[1:]):
            places = ", ".join(f"{d[0]}{'.' + d[1] if d[1] else ''}" for d in where)
            problems.append(f"{m[0]!r}: {name} has several values ({places}): qualify it")
            continue
        value = values[0]
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{m[0]!r}: {name} is {value!r}, not a number")
        elif not math.isclose(value, number, rel_tol=1e-9, abs_tol=1e-12):
            problems.append(f"{m[0]!r}: {name} is {value!r} in the code")
    return names, problems


#: The constants the document must keep stating (and so checking).
STATED = {
    "MAX_SEGMENT",
    "DISPATCH_BUDGET",
    "ConsumerConfig.commit_interval",
    "ConsumerConfig.lane_capacity",
    "DEFAULT_THREAD_THRESHOLD",
    "DEFAULT_ASYNC_THRESHOLD",
    "ConsumerConfig.pull_threshold_size_for_queue",
    "ConsumerConfig.max_span",
    "ConsumerConfig.offset_map_max_bytes",
    "RESUME_FRACTION",
    "STEAL_MULTIPLE",
    "STEAL_FLOOR",
    "WATCH_INTERVAL",
    "ABORT_GRACE",
    "REVOKE_SLICE",
    "ConsumerConfig.revoke_timeout",
    "MESSAGE_BUFFER_PER_LANE",
    "MESSAGE_ACK_INTERVAL",
    "FAILURE_DRAIN",
}


def test_every_number_stated_is_its_constants_value() -> None:
    names, problems = _stated_problems(DOC.read_text(encoding="utf-8"))
    assert problems == [], "docs/ARCHITECTURE.md states numbers the code does not have:\n" + "\n".join(problems)
    assert STATED <= names, f"docs/ARCHITECTURE.md no longer states {sorted(STATED - names)}"


def test_the_number_check_catches_a_wrong_value() -> None:
    names, problems = _stated_problems(
        "`MAX_SEGMENT` (9) and `STEAL_FLOOR` (500 ms), `ConsumerConfig.max_span` (1,048,575), "
        "`ConsumerConfig.commit_interval` = 5 s, `NO_SUCH_LIMIT` (1) and `WAIT_SLICE` (0.02 s)."
    )
    assert names == {
        "MAX_SEGMENT",
        "STEAL_FLOOR",
        "ConsumerConfig.max_span",
        "ConsumerConfig.commit_interval",
        "NO_SUCH_LIMIT",
        "WAIT_SLICE",
    }
    wrong = sorted(p.split(":")[0].strip("'") for p in problems)
    assert wrong == [
        "`ConsumerConfig.max_span` (1,048,575)",  # an expression's value (1 << 20), read from the class
        "`MAX_SEGMENT` (9)",
        "`NO_SUCH_LIMIT` (1)",
        "`WAIT_SLICE` (0.02 s)",  # the Redis source's and the Kafka source's differ
    ], problems


def _loose_numbers(text: str) -> list[str]:
    """Numbers with a unit that stand next to no constant."""
    text = _STATED.sub("", _prose(text))
    text = _SPAN.sub("", text)
    return _LOOSE.findall(text)


def test_every_number_with_a_unit_stands_next_to_its_constant() -> None:
    loose = _loose_numbers(DOC.read_text(encoding="utf-8"))
    assert loose == [], f"docs/ARCHITECTURE.md states numbers without their constant: {loose}"


def test_the_loose_number_check_sees_a_bare_number() -> None:
    assert _loose_numbers("waits `REVOKE_SLICE` (50\nms), then 2 s more, in 4,096\nmessages; step 1.") == [
        "2 s",
        "4,096\nmessages",
    ]


# -- the parts, and the tests that build them alone --------------------------------------

_BUILT_HEADER = "| part | built alone in |"


def _built_alone_rows(text: str) -> list[tuple[int, list[str], list[str]]]:
    """``(line, parts, test files)`` of each row of the document's table
    ``| part | built alone in |`` (no file: the row says no test builds them)."""
    lines = text.splitlines()
    start = lines.index(_BUILT_HEADER)
    rows = []
    for number, line in enumerate(lines[start + 2 :], start + 3):
        if not line.startswith("|"):
            break
        part_cell, files_cell = (cell.strip() for cell in line.strip().strip("|").split("|"))
        rows.append((number, _SPAN.findall(part_cell), _SPAN.findall(files_cell)))
    return rows


def _constructed(path: Path) -> set[str]:
    """The names ``path`` calls: ``Name(...)`` and ``module.Name(...)``."""
    called: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                called.add(node.func.id)
            elif isinstance(node.func, ast.Attribute):
                called.add(node.func.attr)
    return called


def _built_alone_problems(rows: list[tuple[int, list[str], list[str]]]) -> list[str]:
    """What is false in ``rows``: a named test file that does not call a
    part's constructor, or a part said to be built by no test that a test
    builds."""
    tests = {p.relative_to(ROOT).as_posix(): _constructed(p) for p in sorted((ROOT / "tests").rglob("*.py"))}
    problems = []
    for number, parts, files in rows:
        for part in parts:
            if not files:
                builders = [f for f, called in tests.items() if part in called]
                if builders:
                    problems.append(f"line {number}: no test builds {part}, it says, but {builders} call {part}(...)")
            for f in files:
                if f not in tests:
                    problems.append(f"line {number}: {f} is not a test file")
                elif part not in tests[f]:
                    problems.append(f"line {number}: {f} never calls {part}(...)")
    return problems


def test_each_part_is_built_by_the_tests_named() -> None:
    rows = _built_alone_rows(DOC.read_text(encoding="utf-8"))
    parts = {part for _, names, _ in rows for part in names}
    assert len(parts) > 25 and {"Readings", "QueueOrderlyService", "HeldKeys", "PullLoop"} <= parts
    problems = _built_alone_problems(rows)
    assert problems == [], "docs/ARCHITECTURE.md says wrongly which tests build which part:\n" + "\n".join(problems)


def test_the_built_alone_check_catches_a_false_row() -> None:
    text = f"{_BUILT_HEADER}\n|---|---|\n| `Readings` | `tests/test_parts.py` |\n| `Dispatcher` | no test |\n"
    text += "| `Committer` | `tests/test_nothing_here.py` |\n\nprose\n"
    rows = _built_alone_rows(text)
    assert rows == [
        (3, ["Readings"], ["tests/test_parts.py"]),
        (4, ["Dispatcher"], []),
        (5, ["Committer"], ["tests/test_nothing_here.py"]),
    ]
    problems = _built_alone_problems(rows)
    assert [p.split(":")[0] for p in problems] == ["line 3", "line 4", "line 5"], problems

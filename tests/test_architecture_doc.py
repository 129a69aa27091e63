"""docs/ARCHITECTURE.md names only what exists.

Every code span of the document that is a path (``lite_push/_pull/loop.py``,
``sources/redis/reading.py``, ``_ext/router_c.pyx``) must be a file of the
repository, and every one that is a Python name (``Dispatcher``,
``PullLoop.run``, ``poll(timeout, max)``, ``revoke_timeout``) must be
defined in the package: a module, class, function, method, attribute,
parameter or constant of that name.  A rename that leaves the document
behind fails here.
"""

from __future__ import annotations

import ast
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

"""The docs stay true to the code and to each other.

* docs/configuration.md and docs/metrics.md are what ``tools/gen_docs.py``
  writes from the code: a ConsumerConfig field or a metric added without
  running it fails here, and so does one added without its documentation
  in the code (the field's entry in ConsumerConfig's docstring, the
  metric's ``#:`` comment).
* Every relative link of README.md and docs/*.md points to a file that
  exists, and a link to a heading of one of those pages to a heading that
  exists.
* The README stays a front page: short, the install near the top, a quick
  start of at most 15 lines, a link to every page of docs/; each page of
  docs/ (but ARCHITECTURE.md) links back to it.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from lite_push import ConsumerConfig, metric_names

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "gen_docs.py"
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_docs = _load_tool()


# -- the generated pages ---------------------------------------------------------------


@pytest.mark.parametrize("page", ["docs/configuration.md", "docs/metrics.md"])
def test_the_generated_page_is_what_the_code_says(page: str) -> None:
    expected = gen_docs.pages()[page]
    current = (ROOT / page).read_text(encoding="utf-8")
    assert current == expected, f"{page} is not what the code says: run .venv/bin/python tools/gen_docs.py"


def test_every_field_and_every_metric_has_its_entry() -> None:
    configuration = (DOCS / "configuration.md").read_text(encoding="utf-8")
    for name in ConsumerConfig.__dataclass_fields__:
        assert f"\n### `{name}`\n" in configuration, name
        assert f"| [`{name}`](#{name}) |" in configuration, name
    metrics = (DOCS / "metrics.md").read_text(encoding="utf-8")
    for name in (*metric_names.METRICS, *metric_names.SUPERVISOR_METRICS):
        assert f"| `{name}` |" in metrics, name


def test_a_field_without_its_docstring_entry_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = ConsumerConfig.__doc__ or ""
    assert "``tracing``\n" in doc
    monkeypatch.setattr(ConsumerConfig, "__doc__", doc.split("    ``tracing``\n")[0])
    with pytest.raises(gen_docs.DocsError, match="tracing"):
        gen_docs.configuration_md()


def test_check_exits_1_when_a_page_differs_and_writing_mends_it(tmp_path: Path) -> None:
    def tool(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(TOOL), "--root", str(tmp_path), *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )

    (tmp_path / "docs").mkdir()
    for page in gen_docs.pages():
        shutil.copy(ROOT / page, tmp_path / page)
    assert tool("--check").returncode == 0
    stale = tmp_path / "docs" / "metrics.md"
    stale.write_text(stale.read_text(encoding="utf-8").replace("lite_push_lanes_busy", "lite_push_lanes_bizzy"))
    checked = tool("--check")
    assert checked.returncode == 1 and "docs/metrics.md" in checked.stderr, checked.stderr
    assert "bizzy" in stale.read_text(encoding="utf-8")  # --check writes nothing
    written = tool()
    assert written.returncode == 0 and "wrote docs/metrics.md" in written.stdout, written.stderr
    assert tool("--check").returncode == 0


# -- links ------------------------------------------------------------------------------

_FENCE = re.compile(r"^```.*?^```[^\n]*$", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def anchors(path: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings: lower case, without
    punctuation but ``-`` and ``_``, spaces as ``-``; ``-1``, ``-2`` ... on
    repeats."""
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for _, title in _HEADING.findall(text):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        n, candidate = 0, slug
        while candidate in out:
            n += 1
            candidate = f"{slug}-{n}"
        out.add(candidate)
    return out


def links(path: Path) -> Iterator[str]:
    """The link targets of a page, outside code."""
    text = _CODE.sub("", _FENCE.sub("", path.read_text(encoding="utf-8")))
    yield from _LINK.findall(text)


def test_every_relative_link_points_to_what_exists() -> None:
    checked = set(pages())
    broken = []
    for page in pages():
        for target in links(page):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest in checked and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_link_check_sees_links_and_headings() -> None:
    """The link check is not vacuous: it finds the README's links and the
    headings a page links to."""
    readme_links = list(links(README))
    assert "docs/guarantees.md" in readme_links and "benchmarks/RESULTS.md" in readme_links
    assert "processes-and-the-supervisor" in anchors(DOCS / "operations.md")
    assert "group-a-groups-lag-and-resetting-its-offsets" in anchors(DOCS / "cli.md")


# -- the README as a front page ------------------------------------------------------------


def test_the_readme_is_a_front_page() -> None:
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 250
    assert any("pip install" in line for line in lines[:60])
    quick_start = text.split("## Quick start", 1)[1]
    block = re.search(r"^```python\n(.*?)^```$", quick_start, re.MULTILINE | re.DOTALL)
    assert block is not None and len(block.group(1).splitlines()) <= 15
    linked = {(README.parent / t).resolve() for t in links(README)}
    for page in [*sorted(DOCS.glob("*.md")), ROOT / "benchmarks" / "RESULTS.md", ROOT / "grafana" / "README.md"]:
        assert page.resolve() in linked, f"README.md does not link {page.relative_to(ROOT)}"


@pytest.mark.parametrize("page", [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "ARCHITECTURE.md"])
def test_each_page_says_what_it_is_and_links_back(page: str) -> None:
    text = (DOCS / page).read_text(encoding="utf-8")
    title = re.search(r"^# [^\n]+\n\n(.+?)\n\n", text, re.MULTILINE | re.DOTALL)
    assert title is not None, f"{page} has no title and opening paragraph"
    assert "](../README.md)" in title.group(1), f"{page}'s opening paragraph does not link back to the README"

"""The Grafana dashboard uses only the metrics lite_push exports, and they are sane.

Every PromQL expression in ``grafana/dashboards/lite-push.json`` (panel targets,
rows' nested panels, templating queries) may name only series from
:func:`lite_push.metrics.names.exported_series`, must filter on the group /
topic / queue variables where the metric has those labels, and must parse:
with ``promql-parser`` when it is installed (the ``test`` extra), and with a
structural check in any case.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lite_push.metrics.names import METRICS, PREFIX, SUPERVISOR_METRICS, exported_series

try:
    import promql_parser
except ImportError:  # pragma: no cover - the test extra installs it
    promql_parser = None

GRAFANA = Path(__file__).resolve().parent.parent / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "lite-push.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
FILTER_LABELS = ("group", "topic", "queue")

#: Values that stand in for Grafana's variables when an expression is parsed.
GRAFANA_BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
    "__range_s": "3600",
    "__interval_ms": "15000",
}
VARIABLE_SAMPLES = {"group": "(g1|g2)", "topic": "(t1|t2)", "queue": "(0|1)"}

_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_METRIC = re.compile(rf"(?<![\w:]){PREFIX}[A-Za-z0-9_:]*")
_SELECTOR = re.compile(rf"(?<![\w:])({PREFIX}[A-Za-z0-9_:]*)\s*(?:\{{([^}}]*)\}})?")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)\s*$", re.DOTALL)

# --- helpers ----------------------------------------------------------------------


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def iter_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in (collapsed) rows."""
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels") or [])


def variable_query(var: dict[str, Any]) -> str:
    """A query variable's query: a string, or an object with a ``query``."""
    query = var.get("query")
    if isinstance(query, dict):
        query = query.get("query", "")
    return query or ""


def label_values_selector(query: str) -> tuple[str, str]:
    """``label_values(selector, label)`` -> (selector, label)."""
    m = _LABEL_VALUES.match(query)
    assert m, f"not a label_values(selector, label) query: {query!r}"
    return m.group(1), m.group(2)


def panel_expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL expression) for every panel target, rows' panels too."""
    out: list[tuple[str, str]] = []
    for panel in iter_panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if target.get("expr"):
                where = f"panel {panel.get('title')!r} target {target.get('refId')}"
                out.append((where, target["expr"]))
    return out


def collect_expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL expression) for every query in the dashboard.

    A ``label_values(selector, label)`` templating query yields its selector.
    """
    out = panel_expressions(dashboard)
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            selector, _ = label_values_selector(variable_query(var))
            out.append((f"variable {var['name']!r}", selector))
    for ann in dashboard.get("annotations", {}).get("list", []):
        if ann.get("expr"):
            out.append((f"annotation {ann.get('name')!r}", ann["expr"]))
    return out


def metric_names(expr: str) -> set[str]:
    """The ``lite_push_*`` identifiers an expression names (strings ignored)."""
    return set(_METRIC.findall(_STRING.sub('""', expr)))


def unknown_metrics(exprs: list[tuple[str, str]]) -> list[str]:
    """One message per expression naming a series lite_push does not export."""
    known = exported_series()
    problems = []
    for where, expr in exprs:
        bad = sorted(metric_names(expr) - known)
        if bad:
            problems.append(f"{where}: unknown metric(s) {bad} in {expr!r}")
    return problems


def _base_metric(series: str) -> str | None:
    """The METRICS entry a series belongs to (histograms' _bucket, ...)."""
    if series in METRICS:
        return series
    for suffix in ("_bucket", "_sum", "_count", "_created"):
        base = series.removesuffix(suffix)
        if base != series:
            for name in (base, base + "_total"):
                if name in METRICS:
                    return name
    return None


def filter_problems(where: str, expr: str) -> list[str]:
    """Selectors that miss ``label=~"$label"`` for a group/topic/queue label of
    their metric, or that match on a label the metric does not have."""
    problems = []
    for series, matchers in _SELECTOR.findall(expr):
        base = _base_metric(series)
        if base is None:
            continue  # unknown_metrics() reports it
        labels = METRICS[base][1]
        if METRICS[base][0] == "histogram" and series.endswith("_bucket"):
            labels += ("le",)
        found = {name: (op, value) for name, op, value in _MATCHER.findall(matchers)}
        for name in found:
            if name not in labels:
                problems.append(f"{where}: {series} has no label {name!r}: {expr!r}")
        for label in FILTER_LABELS:
            if label in labels and found.get(label) != ("=~", f"${label}"):
                problems.append(f'{where}: {series} is not filtered by {label}=~"${label}": {expr!r}')
    return problems


def substitute_variables(expr: str, variables: set[str]) -> str:
    """Replace Grafana variables by values PromQL accepts; unknown ones raise."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name in GRAFANA_BUILTINS:
            return GRAFANA_BUILTINS[name]
        if name in variables:
            return VARIABLE_SAMPLES.get(name, "x")
        raise ValueError(f"undefined variable ${name}")

    return _VARIABLE.sub(repl, expr)


def structural_problem(expr: str) -> str | None:
    """A parser-free check: balanced (), [] and {} outside strings, closed
    strings, and matchers of the form ``name op "value"`` inside braces."""
    bare = _STRING.sub('""', expr)
    if '"' in _STRING.sub("", expr):
        return "unterminated string"
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for ch in bare:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return f"unbalanced {ch!r}"
    if stack:
        return f"unclosed {stack[-1]!r}"
    for body in re.findall(r"\{([^}]*)\}", expr):
        for part in filter(None, (p.strip() for p in _split_matchers(body))):
            if not _MATCHER.fullmatch(part):
                return f"malformed label matcher {part!r}"
    return None


def _split_matchers(body: str) -> list[str]:
    """Split ``a="x", b=~"y,z"`` at the commas outside strings."""
    parts, current, in_string, escaped = [], [], False, False
    for ch in body:
        if in_string:
            escaped = ch == "\\" and not escaped
            if ch == '"' and not escaped:
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == ",":
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return parts


def syntax_problem(expr: str, variables: set[str]) -> str | None:
    """Why ``expr`` (with Grafana variables) is not valid PromQL, or None."""
    try:
        concrete = substitute_variables(expr, variables)
    except ValueError as exc:
        return str(exc)
    problem = structural_problem(concrete)
    if problem is None and promql_parser is not None:
        try:
            promql_parser.parse(concrete)
        except ValueError as exc:
            problem = f"promql-parser: {exc}"
    return problem


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


@pytest.fixture(scope="module")
def variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


# --- the dashboard ----------------------------------------------------------------


def test_dashboard_identity(dashboard):
    assert dashboard["uid"] == "lite-push-consumer"
    assert dashboard["title"] == "lite_push consumer"
    assert dashboard["tags"] == ["lite_push", "rocketmq", "consumer"]
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard.get("id") is None, "an exported dashboard must not pin an id"


def test_datasource_variable(variables):
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")


@pytest.mark.parametrize(
    ("name", "filters"),
    [("group", ()), ("topic", ("group",)), ("queue", ("group", "topic"))],
)
def test_filter_variables(variables, name, filters):
    var = variables[name]
    assert var["type"] == "query"
    assert var["datasource"] == DATASOURCE
    assert var["multi"] and var["includeAll"], f"${name} must be multi-select with All"
    selector, label = label_values_selector(variable_query(var))
    assert label == name
    (series,) = metric_names(selector)
    assert name in METRICS[_base_metric(series)][1]
    for other in filters:
        assert f'{other}=~"${other}"' in selector, f"${name} is not filtered by ${other}"


def test_every_panel_queries_the_datasource_variable(dashboard):
    panels = [p for p in iter_panels(dashboard["panels"]) if p["type"] != "row"]
    assert len(panels) >= 15
    for panel in panels:
        assert panel.get("datasource") == DATASOURCE, panel["title"]
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        assert panel.get("description"), f"panel {panel['title']!r} has no description"
        for target in panel["targets"]:
            assert target.get("datasource", DATASOURCE) == DATASOURCE, panel["title"]


def test_panel_ids_and_ref_ids_are_unique(dashboard):
    ids = [p["id"] for p in iter_panels(dashboard["panels"])]
    assert len(ids) == len(set(ids))
    for panel in iter_panels(dashboard["panels"]):
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), panel["title"]


def test_expressions_name_only_exported_metrics(dashboard):
    exprs = collect_expressions(dashboard)
    assert len(exprs) >= 20
    problems = unknown_metrics(exprs)
    assert not problems, "\n".join(problems)


def test_panel_expressions_filter_on_the_variables(dashboard):
    # (The variables' own queries are checked by test_filter_variables.)
    exprs = panel_expressions(dashboard)
    problems = [p for where, e in exprs for p in filter_problems(where, e)]
    assert not problems, "\n".join(problems)


def test_expressions_parse(dashboard, variables):
    names = set(variables)
    problems = []
    for where, expr in collect_expressions(dashboard):
        problem = syntax_problem(expr, names)
        if problem:
            problems.append(f"{where}: {problem}: {expr!r}")
    assert not problems, "\n".join(problems)


def test_every_metric_is_on_the_dashboard(dashboard):
    used = set()
    for _, expr in collect_expressions(dashboard):
        used.update(_base_metric(s) for s in metric_names(expr))
    for _, expr in collect_expressions(dashboard):  # the supervisor's series, by name
        used.update(n for n in metric_names(expr) if n in SUPERVISOR_METRICS)
    missing = sorted((set(METRICS) | set(SUPERVISOR_METRICS)) - used)
    assert not missing, f"metrics without a panel: {missing}"


def test_the_build_panel_shows_every_build_info_label(dashboard):
    """Each label of ``lite_push_build_info`` (the version and each compiled
    kernel's implementation) is kept by the Build panel and shown in its legend."""
    (panel,) = [p for p in iter_panels(dashboard["panels"]) if p.get("title") == "Build"]
    (target,) = panel["targets"]
    by = re.search(r"\bby\s*\(([^)]*)\)", target["expr"])
    assert by, target["expr"]
    kept = {label.strip() for label in by.group(1).split(",")}
    labels = METRICS["lite_push_build_info"][1]
    assert set(labels) | {"instance"} == kept
    for label in labels:
        assert "{{" + label + "}}" in target["legendFormat"], label


# --- the checks themselves catch mistakes -----------------------------------------


def test_unknown_metric_is_caught():
    good = "sum(rate(lite_push_messages_polled_total[5m]))"
    bad = 'sum(rate(lite_push_messages_polld_total{group=~"$group"}[5m]))'
    assert metric_names(bad) == {"lite_push_messages_polld_total"}
    assert unknown_metrics([("good", good)]) == []
    (problem,) = unknown_metrics([("panel X", good), ("panel Y", bad)])
    assert "panel Y" in problem and "lite_push_messages_polld_total" in problem
    assert bad in problem
    # A base histogram name is not a series; a name inside a string is ignored.
    assert unknown_metrics([("h", "lite_push_lane_wait_seconds")])
    assert not unknown_metrics([("s", 'up{job="lite_push_whatever"}')])


def test_nested_rows_and_annotations_are_collected():
    dash = {
        "panels": [
            {
                "type": "row",
                "title": "r",
                "collapsed": True,
                "panels": [
                    {
                        "title": "inner",
                        "targets": [{"refId": "A", "expr": "lite_push_x"}],
                    }
                ],
            }
        ],
        "templating": {"list": [{"type": "query", "name": "g", "query": "label_values(lite_push_y, g)"}]},
        "annotations": {"list": [{"name": "a", "expr": "lite_push_z"}]},
    }
    exprs = collect_expressions(dash)
    assert [e for _, e in exprs] == ["lite_push_x", "lite_push_y", "lite_push_z"]
    assert len(unknown_metrics(exprs)) == 3


def test_missing_filter_is_caught():
    where, expr = "p", 'sum(lite_push_lag_messages{group=~"$group", topic=~"$topic"})'
    (problem,) = filter_problems(where, expr)
    assert 'queue=~"$queue"' in problem
    assert filter_problems(where, 'lite_push_lanes{group=~"$group", topic="t"}')
    assert not filter_problems(where, "lite_push_build_info")


@pytest.mark.parametrize(
    "expr",
    [
        "sum(rate(lite_push_lanes[$__rate_interval])",
        "rate(lite_push_lanes[$__rate_interval]))",
        'lite_push_lanes{group=~"$group"',
        'lite_push_lanes{group=~$group"}',
        "lite_push_lanes{group}",
        'lite_push_lanes{group=~"$nosuchvar"}',
    ],
)
def test_broken_expression_is_caught(expr):
    assert syntax_problem(expr, {"group"}) is not None


def test_grafana_variables_are_substituted():
    expr = 'rate(lite_push_lanes{group=~"${group}", queue=~"$queue"}[$__rate_interval])'
    concrete = substitute_variables(expr, {"group", "queue"})
    assert "$" not in concrete
    assert syntax_problem(expr, {"group", "queue"}) is None


@pytest.mark.skipif(promql_parser is None, reason="promql-parser is not installed")
def test_parser_rejects_what_the_structural_check_cannot():
    expr = "sum by (group) (lite_push_lanes) / / 2"
    assert structural_problem(expr) is None
    assert syntax_problem(expr, set()) is not None


# --- the README's panel table -----------------------------------------------------


def dashboard_panels(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """``(row title, panel title)`` of every panel, in the dashboard's order:
    a panel belongs to the row above it, or to the row it is nested in."""
    out: list[tuple[str, str]] = []
    row = ""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            out.extend((row, p["title"]) for p in panel.get("panels") or [])
        else:
            out.append((row, panel["title"]))
    return out


def readme_panel_table(text: str) -> list[tuple[str, str]]:
    """``(Row, Panel)`` of each line of the README's ``| Row | Panel | Shows |`` table."""
    lines = text.splitlines()
    start = lines.index("| Row | Panel | Shows |") + 2  # after the header and its rule
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append((cells[0], cells[1]))
    return rows


def test_the_readme_table_lists_every_panel_in_order(dashboard):
    listed = readme_panel_table((GRAFANA / "README.md").read_text(encoding="utf-8"))
    panels = dashboard_panels(dashboard)
    assert len(panels) >= 19 and ("Processing", "Slow calls") in panels
    missing = [p for p in panels if p not in listed]
    assert missing == [], f"grafana/README.md's panel table lacks {missing}"
    assert listed == panels, "grafana/README.md's panel table is not the dashboard's panels, in order"


def test_the_panel_table_check_sees_rows_nested_or_not():
    flat = {"panels": [{"type": "row", "title": "R"}, {"type": "timeseries", "title": "A"}]}
    nested = {"panels": [{"type": "row", "title": "R", "collapsed": True, "panels": [{"type": "stat", "title": "A"}]}]}
    assert dashboard_panels(flat) == dashboard_panels(nested) == [("R", "A")]
    table = "x\n| Row | Panel | Shows |\n|---|---|---|\n| R | A | it |\n| R | B | that |\n\n| not | a row |\n"
    assert readme_panel_table(table) == [("R", "A"), ("R", "B")]


# --- provisioning -----------------------------------------------------------------


def test_provisioning_files():
    ds = (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    assert "apiVersion: 1" in ds and "type: prometheus" in ds
    assert "url: http://127.0.0.1:9090" in ds
    assert re.search(r"^\s+uid: \S+", ds, re.MULTILINE)
    provider = (GRAFANA / "provisioning" / "dashboards" / "lite-push.yml").read_text()
    assert "apiVersion: 1" in provider and "type: file" in provider
    (path,) = re.findall(r"^\s+path: (\S+)", provider, re.MULTILINE)
    assert path in (GRAFANA / "README.md").read_text(), "README must name the path"


# --- the metric names themselves --------------------------------------------------


@pytest.mark.parametrize("name", sorted(METRICS))
def test_metric_definition(name):
    kind, labels, help_text = METRICS[name]
    assert name.startswith(PREFIX)
    assert re.fullmatch(r"[a-z_][a-z0-9_]*", name), name
    assert kind in ("counter", "gauge", "histogram"), kind
    assert isinstance(help_text, str) and help_text.strip(), f"{name} has no help"
    assert not {"key", "lane"} & set(labels), f"{name} has an unbounded label"
    assert len(set(labels)) == len(labels)
    assert (kind == "counter") == name.endswith("_total"), name
    if kind == "histogram" or re.search(r"duration|latency|wait", name):
        # a counter of seconds keeps its unit before _total (process_cpu_seconds_total)
        assert name.removesuffix("_total").endswith("_seconds"), f"{name}: durations are in seconds"


def test_exported_series_cover_the_suffixes():
    series = exported_series()
    for name, (kind, _, _) in METRICS.items():
        if kind == "histogram":
            assert {name + s for s in ("_bucket", "_sum", "_count")} <= series
        else:
            assert name in series

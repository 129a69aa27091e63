"""The public API (issue 27, item 7): what ``lite_push`` and ``lite_push.testing``
export, that each name is importable and ``__all__`` stays sorted, one type per
listener, the three kernel selections in sight, and that ``lite_push.testing``
needs pytest only when it is imported."""

from __future__ import annotations

import ast
import inspect
import logging
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import lite_push
import lite_push.testing
from lite_push import (
    LANE_METRICS_IMPL,
    OFFSETS_IMPL,
    ROUTER_IMPL,
    AsyncLitePushConsumer,
    ConsumerConfig,
    EmbeddedBroker,
    LitePushConsumer,
    _types,
    sources,
)
from lite_push._exec import async_executor as _async_executor
from lite_push._kernels import lanemetrics as _lanemetrics
from lite_push._kernels import offsets as _offsets
from lite_push._kernels import router as _router
from lite_push._pull import assignment as _assignment

PACKAGE = Path(lite_push.__file__).resolve().parent
ROOT = PACKAGE.parent


def ruf022_key(name: str) -> tuple[int, list[object]]:
    """How ruff's RUF022 orders ``__all__`` (its default, "isort-style"):
    SCREAMING_SNAKE_CASE first, then CamelCase, then the rest, each in
    natural order (digit runs compared as numbers)."""
    if len(name) > 1 and name.isupper():
        kind = 0
    elif name[:1].isupper():
        kind = 1
    else:
        kind = 2
    natural: list[object] = [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
    return kind, natural


def test_the_sort_key_is_ruffs() -> None:
    names = ["resend", "__version__", "Clock", "OFFSETS_IMPL", "AppHook", "LANE_METRICS_IMPL", "q10", "q9"]
    assert sorted(names, key=ruf022_key) == [
        "LANE_METRICS_IMPL",
        "OFFSETS_IMPL",
        "AppHook",
        "Clock",
        "__version__",
        "q9",
        "q10",
        "resend",
    ]


@pytest.mark.parametrize("module", [lite_push, lite_push.testing], ids=lambda m: m.__name__)
def test_all_is_sorted_unique_and_importable(module: types.ModuleType) -> None:
    names = list(module.__all__)
    assert names == sorted(names, key=ruf022_key)
    assert len(set(names)) == len(names)
    for name in names:
        assert getattr(module, name, None) is not None, f"{module.__name__}.{name} is in __all__ but missing"
    star: dict[str, object] = {}
    exec(f"from {module.__name__} import *", star)
    assert set(star) - {"__builtins__"} == set(names)


def test_every_public_name_of_lite_push_is_in_all() -> None:
    """Nothing is exported by accident: what ``lite_push`` holds, other than
    its submodules and underscored names, is listed in ``__all__``; the
    embedded broker's names, imported on first use, resolve."""
    lazy = {"EmbeddedBroker", "EmbeddedPullConsumer"}
    public = {
        name
        for name, value in vars(lite_push).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public - lazy == set(lite_push.__all__) - {"__version__"} - lazy
    assert all(isinstance(getattr(lite_push, name), type) for name in lazy)


def test_the_application_rebalance_hook_type_is_exported() -> None:
    assert lite_push.AppHook is _assignment.AppHook
    for consumer in (LitePushConsumer, AsyncLitePushConsumer):
        params = inspect.signature(consumer).parameters
        assert params["on_assigned"].annotation == params["on_revoked"].annotation == "AppHook | None"


def test_rebalance_listener_belongs_to_the_source_contract_not_the_top_level() -> None:
    """The consumer implements the source's ``RebalanceListener`` itself;
    applications use ``on_assigned`` / ``on_revoked``."""
    assert "RebalanceListener" not in lite_push.__all__
    assert not hasattr(lite_push, "RebalanceListener")
    assert "RebalanceListener" in sources.__all__
    assert sources.PullSource.rebalance_listener.__doc__


def _assigned_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_each_listener_type_is_defined_once() -> None:
    for name in ("Listener", "AsyncListener"):
        defined_in = [p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*.py") if name in _assigned_names(p)]
        assert defined_in == ["lite_push/_types.py"], (name, defined_in)
    assert lite_push.AsyncListener is _types.AsyncListener is _async_executor.AsyncListener
    assert lite_push.Listener is _types.Listener


def test_the_three_kernel_selections_are_public() -> None:
    selected = {
        "ROUTER_IMPL": (ROUTER_IMPL, _router.ROUTER_IMPL),
        "OFFSETS_IMPL": (OFFSETS_IMPL, _offsets.OFFSETS_IMPL),
        "LANE_METRICS_IMPL": (LANE_METRICS_IMPL, _lanemetrics.LANE_METRICS_IMPL),
    }
    for name, (exported, selector) in selected.items():
        assert name in lite_push.__all__
        assert exported == selector and exported in ("cython", "python"), name


def test_the_start_up_log_names_the_three_kernels(caplog: pytest.LogCaptureFixture) -> None:
    broker = EmbeddedBroker()
    broker.create_topic("T", queue_count=1)
    c = LitePushConsumer(ConsumerConfig(group="g", lanes=1), broker.pull_consumer("g"), lambda msgs: None)
    c.subscribe("T")
    with caplog.at_level(logging.INFO, logger="lite_push"):
        with c:
            pass
    broker.close()
    (line,) = [r.getMessage() for r in caplog.records if "started:" in r.getMessage()]
    assert f"router={ROUTER_IMPL} offsets={OFFSETS_IMPL} lane_metrics={LANE_METRICS_IMPL}" in line


# -- lite_push.testing ----------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_importing_lite_push_does_not_import_pytest_or_the_suite() -> None:
    done = _python(
        "import sys, lite_push, lite_push.sources; "
        "print(sorted(m for m in ('pytest', 'lite_push.testing') if m in sys.modules))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_suite_without_pytest_says_what_to_install() -> None:
    done = _python(
        "import sys\n"
        "sys.modules['pytest'] = None  # as if it were not installed\n"
        "try:\n"
        "    import lite_push.testing\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "lite_push.testing" in done.stdout and "pip install 'lite-push[testing]'" in done.stdout


def test_the_suite_is_documented() -> None:
    doc = lite_push.testing.__doc__ or ""
    for needed in ("SourceContract", "SourceHarness", "``harness``", "caplog", "pytest"):
        assert needed in doc, needed
    for name in lite_push.testing.__all__:
        assert inspect.getdoc(getattr(lite_push.testing, name)), name
    harness = lite_push.testing.SourceHarness
    for name in harness.__abstractmethods__:
        assert inspect.getdoc(getattr(harness, name)), name


def test_the_suite_asserts_report_their_values_under_pytest() -> None:
    """The suite's modules with asserts are rewritten by pytest, as test modules are."""
    for name in ("_contract_groups", "_contract_reading", "_contract_retry", "_contract_start", "_polling"):
        module = sys.modules[f"lite_push.testing.{name}"]
        assert type(module.__loader__).__name__ == "AssertionRewritingHook", name


def test_every_source_runs_the_whole_suite() -> None:
    """The embedded, Redis and Kafka tests each subclass the shipped suite."""
    runs = {"test_source_embedded": 1, "test_source_redis": 2, "test_source_kafka": 1}
    for module_name, expected in runs.items():
        module = __import__(module_name)
        subclasses = [
            cls
            for name, cls in vars(module).items()
            if name.startswith("Test") and isinstance(cls, type) and issubclass(cls, lite_push.testing.SourceContract)
        ]
        assert len(subclasses) == expected, (module_name, subclasses)


APPLICATION = """
import datetime

from lite_push import ConsumerConfig, LitePushConsumer, MessageExt
from lite_push.sources import EmbeddedBroker


def handle(messages: list[MessageExt]) -> None:
    for m in messages:
        print(m.keys, m.body)


def main() -> None:
    broker = EmbeddedBroker()
    broker.create_topic("orders", 4)
    source = broker.pull_consumer("billing", consume_from="first")
    later = broker.pull_consumer("audit", consume_from=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
    later.close()
    consumer = LitePushConsumer(ConsumerConfig(mode="key_orderly", lanes=8), source, handle)
    consumer.subscribe(["orders"])
    report = consumer.run()
    print(report.summary(), consumer.stats())
"""


def test_an_application_of_the_readme_s_api_passes_mypy_strict(tmp_path: Path) -> None:
    """Issue 41: the names a user passes (a mode's name, "first", a list of
    topics) are typed, so an application type-checks under --strict."""
    app = tmp_path / "app.py"
    app.write_text(APPLICATION)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--follow-imports=silent", str(app)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "MYPYPATH": str(Path(lite_push.__file__).resolve().parent.parent)},
    )
    assert done.returncode == 0, done.stdout + done.stderr

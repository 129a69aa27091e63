"""Shared fixtures.

Compiled kernels have pure-Python twins, and tests take the twin as a fixture
parametrized with ids ``c`` / ``py``, so every case runs against both.  The
``c`` case is skipped only when the extension was honestly not built: no
``.so`` in the package and ``LITE_PUSH_REQUIRE_EXTENSIONS`` unset.  If it was
built (or is required) but does not import, the ``c`` case fails.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from executors import EXECUTORS, Executor, executor_fixture
from hypothesis import HealthCheck, settings

import lite_push
from lite_push._kernels import router_py as _router_py
from lite_push.cli.settings import NON_CONFIG_ENV
from lite_push.sources import EmbeddedBroker
from lite_push.sources.redis_server import RedisCluster, RedisServer

PACKAGE_DIR = Path(lite_push.__file__).resolve().parent
KERNELS_DIR = PACKAGE_DIR / "_kernels"

# Hypothesis: the suite draws the same examples on every run and every clean
# checkout ("ci", the default: derandomized, no example database, no
# wall-clock limits, which a shared machine would make flaky), so a change
# cannot fail on inputs it did not touch.  HYPOTHESIS_PROFILE=explore draws
# new random examples, more of them where a test does not set its own count;
# a failure it finds prints the seed to reproduce it with
# (pytest --hypothesis-seed=N).  See the README's "Tests" section.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("explore", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: ``LITE_PUSH_NO_EXTENSIONS`` set: the selectors use the Python twins.
NO_EXTENSIONS = bool(os.environ.get("LITE_PUSH_NO_EXTENSIONS"))
#: ``LITE_PUSH_REQUIRE_EXTENSIONS=1`` (scripts/test.sh sets it): a missing
#: compiled module is a failure, never a skip.
REQUIRE_EXTENSIONS = os.environ.get("LITE_PUSH_REQUIRE_EXTENSIONS") == "1"


def compiled_path(stem: str) -> Path | None:
    """The built extension file ``lite_push/_kernels/<stem>.<abi>.so``, if there is one."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = KERNELS_DIR / f"{stem}{suffix}"
        if path.exists():
            return path
    return None


def compiled_twin(stem: str) -> ModuleType:
    """Import ``lite_push._kernels.<stem>``; skip if it was not built and is not
    required, fail if it was built or is required but does not import."""
    try:
        return importlib.import_module(f"lite_push._kernels.{stem}")
    except ImportError as exc:
        built = compiled_path(stem)
        if REQUIRE_EXTENSIONS or built is not None:
            pytest.fail(
                f"lite_push._kernels.{stem} is {'built at ' + str(built) if built else 'required'} "
                f"but does not import: {exc}"
            )
        pytest.skip(f"lite_push._kernels.{stem} was not built")


def assert_compiled_selected(stem: str, impl: str, selected: object, name: str) -> None:
    """Fails when ``lite_push.<stem>`` was built (or is required) but its
    selector silently fell back to the Python twin: ``impl`` is the
    selector's ``*_IMPL``, ``selected`` what it exports as ``name``."""
    if NO_EXTENSIONS:
        assert impl == "python"
        return
    if compiled_path(stem) is None and not REQUIRE_EXTENSIONS:
        pytest.skip(f"lite_push._kernels.{stem} was not built")
    assert impl == "cython"
    assert selected is getattr(compiled_twin(stem), name)


@pytest.fixture(scope="session", params=["c", "py"])
def router(request: pytest.FixtureRequest) -> ModuleType:
    """The key-hash router twin: ``lite_push._kernels.router_c`` or ``_router_py``."""
    if request.param == "c":
        return compiled_twin("router_c")
    return _router_py


@pytest.fixture(params=EXECUTORS)
def executor(request: pytest.FixtureRequest) -> Iterator[Executor]:
    """Each executor in turn (threads, asyncio, uvloop); modules that use
    ``executors.EX`` take it with ``pytestmark = pytest.mark.usefixtures("executor")``."""
    yield from executor_fixture(request)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No LITE_PUSH_* settings from the caller's environment (the variables
    the package reads for itself, ``NON_CONFIG_ENV``, stay)."""
    for var in list(os.environ):
        if var.startswith("LITE_PUSH_") and var not in NON_CONFIG_ENV:
            monkeypatch.delenv(var)


@pytest.fixture
def spans() -> Iterator[Any]:
    """The spans finished during the test (the SDK's in-memory exporter on
    the process's tracer provider: ``tracing_helpers``)."""
    from tracing_helpers import install

    exporter = install()
    yield exporter
    exporter.clear()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A redis-server on a loopback port (no AOF), per test module."""
    with RedisServer(appendonly=False) as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """Three redis-server masters on loopback ports, shared by the session
    (tests use their own namespaces)."""
    with RedisCluster() as cluster:
        yield cluster


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    """An embedded broker with topic ``T`` of 2 queues (a module may define
    its own ``broker``, which takes precedence)."""
    b = EmbeddedBroker()
    b.create_topic("T", queue_count=2)
    yield b
    b.close()

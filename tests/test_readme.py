"""The Python examples of the README and of docs/ run, as a reader would paste them.

The ```python blocks of each page (README.md and the docs/ pages that have
any) run in one fresh interpreter per page, one after another in a shared
namespace (a later block of a page may use the broker and listener of an
earlier one; no page uses another's), and what they print is checked
against what the page says they do.  The ProcessSupervisor example of
docs/operations.md (whose members import its program again) also runs as a
program of its own, against a Redis the test starts, and the example of a
source of one's own (docs/writing-a-source.md) runs under pytest as the
test module the page says to save it as.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import wait_until

from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer, free_port
from lite_push.testing import SourceContract

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)

RUNNER = textwrap.dedent(
    """
    import sys
    namespace = {"__name__": "__readme__"}
    for i, block in enumerate(BLOCKS):
        print(f"--- block {i}", flush=True)
        exec(compile(block, f"{PAGE} python block {i}", "exec"), namespace)
    print("--- done", flush=True)
    """
)


def page_blocks(page: str) -> list[str]:
    """The ```python blocks of ``page`` (a path from the repository's root), in order."""
    return BLOCK.findall((ROOT / page).read_text(encoding="utf-8"))


# What each page's blocks print, checked.  A check that fails names the page's output.


def _readme(out: str) -> None:
    # the quick start: run() consumed the 1,000 messages, stop() ended it, and its stop report says
    # every queue was committed
    assert "\noffsets committed for 4 queues\n" in out, out[-3000:]


def _embedding(out: str) -> None:
    # block 0: all 1,000 messages of 50 keys consumed, each key in offset order
    assert "ConsumerStats(consumed=1000" in out, out[-3000:]
    assert "\noffsets committed for 4 queues\n" in out, out[-3000:]  # run()'s stop report
    assert "50 keys, each in offset order: True" in out, out[-3000:]
    # block 1: the application-loop consumer consumed them too
    assert "app loop consumed 1000" in out, out[-3000:]
    # block 2: the hooks were called (a one-member group owns every queue)
    assigned = "assigned " + str([f"ORDER@embedded#{i}" for i in range(4)])
    assert assigned in out, out[-3000:]
    assert "paused keys: ['account-7'] 0" in out, out[-3000:]  # a new group starts at the end: none waits
    assert "revoked [" not in out, out[-3000:]  # the shutdown does not call on_revoked
    # block 3: the rate-limited consumer consumed everything, and both limits acted
    assert "paced consumed 1000 | waited for max_rate: True | held for their key's interval: True" in out, out[-3000:]


def _sources(out: str) -> None:
    # block 0: Kafka (the mock cluster)
    assert "kafka consumed 1000" in out, out[-3000:]
    # block 1: the key extractor: 40 cards as keys, each in offset order
    assert "40 cards, each in offset order: True" in out, out[-3000:]


def _operations(out: str) -> None:
    # block 0 (the process supervisor) only defines its program here: it runs as one below
    # block 1: the exporter served the build info, with each kernel's implementation
    build_info = [line for line in out.splitlines() if "lite_push_build_info" in line]
    assert build_info, out[-3000:]
    for label in ("router=", "offsets=", "lane_metrics="):
        assert label in build_info[0], out[-3000:]


def _writing_a_source(out: str) -> None:
    pass  # it defines a test module: run under pytest below


#: Each page with ```python blocks: how many it has (if one is dropped, say so here too) and the
#: check of what they print.
PAGES: dict[str, tuple[int, Callable[[str], None]]] = {
    "README.md": (1, _readme),  # the quick start
    "docs/embedding.md": (4, _embedding),  # a consumer, async listeners, hooks, rate limits
    "docs/sources.md": (2, _sources),  # Kafka, a key extractor
    "docs/operations.md": (2, _operations),  # the process supervisor, metrics
    "docs/writing-a-source.md": (1, _writing_a_source),  # a source of one's own
}


def test_the_pages_have_python_examples() -> None:
    pages = ["README.md", *(p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "docs").glob("*.md")))]
    with_blocks = {p: len(page_blocks(p)) for p in pages if page_blocks(p)}
    assert with_blocks == {p: n for p, (n, _) in PAGES.items()}


@pytest.mark.parametrize("page", list(PAGES))
def test_every_python_example_runs(page: str) -> None:
    blocks = page_blocks(page)
    program = f"PAGE = {page!r}\nBLOCKS = {blocks!r}\n{RUNNER}"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=240, cwd=ROOT)
    out = done.stdout
    assert done.returncode == 0, f"{page} example failed:\n{out[-3000:]}\n{done.stderr[-5000:]}"
    assert out.rstrip().endswith("--- done"), out[-3000:]
    PAGES[page][1](out)


def test_the_source_example_runs_the_contract_suite(tmp_path: Path) -> None:
    """Saved as ``test_my_source.py`` and run with pytest, as
    docs/writing-a-source.md says, outside this repository's tests (no
    conftest): every contract test runs on it and passes."""
    blocks = page_blocks("docs/writing-a-source.md")
    block = next(b for b in blocks if "class TestMySourceContract(SourceContract)" in b)
    (tmp_path / "test_my_source.py").write_text(block)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_source.py"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    expected = sum(_cases(getattr(SourceContract, n)) for n in dir(SourceContract) if n.startswith("test_"))
    assert expected > 30 and re.search(rf"\b{expected} passed\b", done.stdout), done.stdout[-3000:]


def _cases(test: object) -> int:
    """How many tests pytest makes of a test function (one per parameter set)."""
    n = 1
    for mark in getattr(test, "pytestmark", []):
        if mark.name == "parametrize":
            n *= len(mark.args[1])
    return n


def test_the_supervisor_example_runs_as_a_program(tmp_path: Path, redis_server: RedisServer) -> None:
    """The ProcessSupervisor example of docs/operations.md, saved as a
    program of its own (members import it again, as the page says) with this
    test's Redis and port: it consumes the topic with two members, serves
    their metrics on one port, and SIGTERM makes it drain, commit and exit 0."""
    block = next(b for b in page_blocks("docs/operations.md") if "ProcessSupervisor(" in b)
    assert re.search(r"^def handle\(", block, re.MULTILINE), "the example defines its module-level listener"
    port = free_port()
    program = block.replace("redis://127.0.0.1:6379/0", redis_server.url).replace("9464", str(port))
    assert program != block and str(port) in program
    (tmp_path / "service.py").write_text(program)
    broker = RedisBroker(redis_server.url)
    try:
        broker.create_topic("ORDER", queue_count=4)
        proc = subprocess.Popen([sys.executable, "service.py"], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
        try:
            ready = f"http://127.0.0.1:{port}/readyz"
            assert wait_until(lambda: _status(ready) == 200, timeout=60), _status(ready)
            broker.send_batch("ORDER", [(b"x", f"k{i % 40}") for i in range(2000)])
            queues = broker.queues("ORDER")
            assert wait_until(lambda: sum(_consumed(f"http://127.0.0.1:{port}/metrics").values()) == 2000, timeout=60)
            assert set(_consumed(f"http://127.0.0.1:{port}/metrics")) == {"0", "1"}  # two members on one port
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err[-3000:]
        for q in queues:
            committed = broker.committed("sms", q)
            assert committed is not None and committed.offset == broker.max_offset(q), q
    finally:
        broker.close()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def _consumed(url: str) -> dict[str, float]:
    """Per member, the successes on the supervisor's one page."""
    with urllib.request.urlopen(url, timeout=5) as r:
        page = r.read().decode()
    out: dict[str, float] = {}
    for line in page.splitlines():
        if line.startswith("lite_push_messages_processed_total{") and 'outcome="success"' in line:
            member = line.split('member="', 1)[1].split('"', 1)[0]
            out[member] = out.get(member, 0.0) + float(line.rsplit(" ", 1)[1])
    return out

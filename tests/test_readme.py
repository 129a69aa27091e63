"""The README's Python examples run, in order, as a reader would paste them.

Each ```python block of README.md is run in one fresh interpreter, the blocks
one after another in a shared namespace (a later block uses the broker and
listener of the first), and what they print is checked against what the
README says they do.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)

RUNNER = textwrap.dedent(
    """
    import sys
    namespace = {"__name__": "__readme__"}
    for i, block in enumerate(BLOCKS):
        print(f"--- block {i}", flush=True)
        exec(compile(block, f"README.md python block {i}", "exec"), namespace)
    print("--- done", flush=True)
    """
)


def readme_blocks() -> list[str]:
    """The README's ```python blocks, in order."""
    return BLOCK.findall(README.read_text(encoding="utf-8"))


def test_the_readme_has_python_examples() -> None:
    # embedding, async listeners, Kafka, hooks, rate limits, metrics, the process supervisor:
    # if one is dropped, say so here too
    assert len(readme_blocks()) == 7


def test_every_readme_python_example_runs() -> None:
    blocks = readme_blocks()
    program = f"BLOCKS = {blocks!r}\n{RUNNER}"
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=240, cwd=README.parent
    )
    out = done.stdout
    assert done.returncode == 0, f"README example failed:\n{out[-3000:]}\n{done.stderr[-5000:]}"
    assert out.rstrip().endswith("--- done"), out[-3000:]
    # block 0: all 1,000 messages of 50 keys consumed, each key in offset order
    assert "ConsumerStats(consumed=1000" in out, out[-3000:]
    assert "50 keys, each in offset order: True" in out, out[-3000:]
    # block 1: the application-loop consumer consumed them too
    assert "app loop consumed 1000" in out, out[-3000:]
    # block 2: the same on Kafka (the mock cluster)
    assert "kafka consumed 1000" in out, out[-3000:]
    # block 3: the hooks were called (a one-member group owns every queue)
    assigned = "assigned " + str([f"ORDER@embedded#{i}" for i in range(4)])
    assert assigned in out, out[-3000:]
    # block 4: the rate-limited consumer consumed everything, and both limits acted
    assert "paced consumed 1000 | waited for max_rate: True | held for their key's interval: True" in out, out[-3000:]
    # block 5: the exporter served the build info
    build_info = [line for line in out.splitlines() if "lite_push_build_info" in line]
    assert build_info and "router=" in build_info[0], out[-3000:]

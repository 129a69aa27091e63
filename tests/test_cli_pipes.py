"""A ``lite-push`` command whose output's reader goes away
(``lite-push dlq list ... | head -1``) stops there quietly: no traceback,
exit status 141 (128 + SIGPIPE, what a shell reports for a Unix tool that
SIGPIPE ended).

Each command runs as a subprocess whose standard output is a pipe; the test
reads the first line, then closes its end.  The commands write far more than
a pipe holds, so they are still writing when it closes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lite_push import ConsumeFromWhere, EmbeddedBroker
from lite_push.cli.pipes import SIGPIPE_EXIT, closed_pipe_exit

REPO = Path(__file__).resolve().parent.parent

#: Dead letters in the test's DLQ: ~100 bytes a line, eight pipes' worth.
LETTERS = 5000


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A durable embedded broker: group g's DLQ holds LETTERS dead letters;
    topic WIDE has 4000 queues (``topic describe`` prints a line each)."""
    path = tmp_path_factory.mktemp("pipes") / "data"
    with EmbeddedBroker(path) as broker:
        broker.create_topic("T", 1)
        broker.create_topic("WIDE", 4000)
        for i in range(LETTERS):
            broker.send("T", b"body %d" % i, keys=f"k{i}")
        c = broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET)
        c.subscribe("T")
        msgs = []
        while len(msgs) < LETTERS:
            msgs += [m for b in c.poll(5.0) for m in b.messages]
        assert c.send_to_dlq([(m, "NonRetryableError", "bad") for m in msgs]) == [None] * LETTERS
        c.close()
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITE_PUSH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _first_line_then_close(argv: list[str], *, stderr_too: bool = False) -> tuple[bytes, int, str]:
    """Run ``lite-push argv``, read one line of its standard output (and,
    with ``stderr_too``, of its standard error, the same pipe: ``2>&1 |
    head -1``), close the pipe; return the line, the exit status and what
    it wrote on standard error (when that is a pipe of its own)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lite_push", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if stderr_too else subprocess.PIPE,
        env=_env(),
    )
    assert proc.stdout is not None
    try:
        first = proc.stdout.readline()
        proc.stdout.close()
        err = b"" if proc.stderr is None else proc.stderr.read()
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return first, code, err.decode()


@pytest.mark.parametrize(
    ("argv", "first"),
    [
        (["dlq", "list"], b"offset=0 origin=T/0/0 "),
        (["dlq", "list", "--json"], b'{"dlq_topic":"%DLQ%g","dlq_offset":0,'),
        (["dlq", "list", "--start", "7"], b"offset=7 origin=T/0/7 "),
        (["topic", "describe", "--topic", "WIDE"], b"queue=0 first=0 end=0 messages=0"),
    ],
)
def test_a_closed_output_pipe_ends_the_command_quietly(data: Path, argv: list[str], first: bytes) -> None:
    source = ["--source", f"embedded:{data}"] + (["--group", "g"] if argv[0] == "dlq" else [])
    line, code, err = _first_line_then_close([*argv, *source])
    assert line.startswith(first), line
    assert (code, err) == (SIGPIPE_EXIT, "")
    assert SIGPIPE_EXIT == 141


def test_a_closed_pipe_behind_both_streams_ends_the_command_quietly(data: Path) -> None:
    """``2>&1 | head -1``: standard error is the closed pipe too (a
    traceback written there would fail in turn, and end the interpreter
    with another status)."""
    argv = ["dlq", "list", "--source", f"embedded:{data}", "--group", "g"]
    line, code, _ = _first_line_then_close(argv, stderr_too=True)
    assert line.startswith(b"offset=0 ")
    assert code == SIGPIPE_EXIT


def test_a_broken_pipe_that_is_not_the_output_is_raised_again(capsys: pytest.CaptureFixture[str]) -> None:
    """A ``BrokenPipeError`` from anything but a closed standard stream (a
    socket, a child's pipe) is a failure, not the reader going away."""
    error = BrokenPipeError(32, "Broken pipe")
    with pytest.raises(BrokenPipeError) as raised:
        closed_pipe_exit(error)
    assert raised.value is error
    print("still writable")
    assert capsys.readouterr().out == "still writable\n"

"""lite_push through its command line (issue 40), shared by
``lite_push_cli_kafka_runner.py`` and ``lite_push_cli_redis_runner.py``,
which differ only in the ``--source`` URL.

The runner runs, in its own process, the command a user types:

    lite-push consume --source URL --group G --topic T --from first \\
        --listener lite_push_cli_listener:listener --progress off --log-level WARNING

with every other setting at its default, by calling the command's entry
point with that argument list: ``lite_push.cli.main(argv)``, which
``lite-push`` runs (pyproject's ``[project.scripts]``: ``lite_push.__main__:main``,
which calls it).  The listener is ``lite_push_cli_listener.py``'s ``async def``
(so the command picks the asyncio executor; bookkeeping as
``lite_push_consume.py``'s).  ``--progress off``: no status line every 5 s
during the measurement (``auto``, the default, prints none either, since
stdout is not a terminal here); ``--log-level WARNING`` rather than INFO.

Stopping: the call that handles the last ``seq`` takes the CPU mark
(``Usage.stop``) and sends SIGTERM to this process; the command stops as
it would for a user (stop polling, drain up to ``--shutdown-timeout``,
commit, exit 0 when everything finished).  A watcher thread does the same
at ``--cap`` (a capped run) or ``--timeout`` (an error).  The command's
exit status is in the record (``config.exit_status``, with its last output
line); any status but 0 is the run's error.  What it printed goes to
stderr after it returned.

Settings (``--set KEY=VALUE``), each passed only when set, so that unset
means the command's default: the flags ``lanes``, ``executor``,
``lane_placement``, ``log_level`` (default WARNING); and the consumer
fields ``batch_size``, ``pull_batch_size``, ``pull_threshold_for_queue``,
``lane_capacity``, ``loop_turn_target``, written to a ``--config`` TOML
file's ``[consumer]`` table (they have no flags).  ``t0`` is taken just
before the command is called (its parsing, the listener's import and the
source's and consumer's construction are in the CPU and the start).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import lite_push_cli_listener
from runner_protocol import Calls, Usage, load_costs, settings_of, write_out

from lite_push.cli import main as lite_push_main

__all__ = ["CONSUMER_FIELDS", "DEFAULTS", "FLAGS", "command", "run_command"]

#: Settings passed as the command's flags (only when set).
FLAGS = ("lanes", "executor", "lane_placement")
#: Settings with no flag: ConsumerConfig fields, through a ``--config`` file.
CONSUMER_FIELDS = ("batch_size", "pull_batch_size", "pull_threshold_for_queue", "lane_capacity", "loop_turn_target")

DEFAULTS: dict[str, Any] = {**dict.fromkeys(FLAGS), **dict.fromkeys(CONSUMER_FIELDS), "log_level": "WARNING"}
CHOICES = {
    "executor": ("thread", "asyncio"),
    "lane_placement": ("load", "hash", "java"),
    "log_level": ("DEBUG", "INFO", "WARNING", "ERROR"),
}

#: The listener, as the command takes it.
LISTENER = "lite_push_cli_listener:listener"


def command(url: str, topic: str, group: str, settings: dict[str, Any], config_file: Path | None) -> list[str]:
    """The ``lite-push`` argument list (after the program name)."""
    argv = [
        "consume",
        "--source",
        url,
        "--group",
        group,
        "--topic",
        topic,
        "--from",
        "first",
        "--listener",
        LISTENER,
        "--progress",
        "off",
        "--log-level",
        settings["log_level"],
    ]
    for name in FLAGS:
        if settings[name] is not None:
            argv += [f"--{name.replace('_', '-')}", str(settings[name])]
    if config_file is not None:
        argv += ["--config", str(config_file)]
    return argv


def _config_file(settings: dict[str, Any], out: Path) -> Path | None:
    """A TOML file with the consumer fields that were set (None: none was)."""
    fields = {name: settings[name] for name in CONSUMER_FIELDS if settings[name] is not None}
    if not fields:
        return None
    path = out.with_name(out.stem + ".lite-push.toml")
    # the command converts text to each field's type (lite_push.cli.settings)
    path.write_text("[consumer]\n" + "".join(f"{k} = {json.dumps(str(v))}\n" for k, v in fields.items()))
    return path


class Stopper:
    """Stops the command once: takes the CPU mark and sends this process
    SIGTERM.  ``why`` says why the first stop came (``None``: every ``seq``
    was handled; ``"cap"``; ``"timeout"``)."""

    def __init__(self, usage: Usage) -> None:
        self.usage = usage
        self.done = threading.Event()
        self.why: str | None = None
        self._lock = threading.Lock()

    def stop(self, why: str | None = None) -> None:
        with self._lock:
            if self.done.is_set():
                return
            self.usage.stop()
            self.why = why
            self.done.set()
        os.kill(os.getpid(), signal.SIGTERM)


def run_command(args: argparse.Namespace, url: str, source_name: str) -> int:
    """Run the command over ``args.topic`` on ``url`` and write OUT.json."""
    settings = settings_of(args.set, DEFAULTS, CHOICES)
    costs = load_costs(args.costs)
    calls = Calls(len(costs))
    usage = Usage()
    stopper = Stopper(usage)
    lite_push_cli_listener.arm(costs, calls, stopper.stop)
    config_file = _config_file(settings, args.out)
    argv = command(url, args.topic, args.group, settings, config_file)

    capped = args.cap is not None and args.cap <= args.timeout
    limit = min(args.cap, args.timeout) if args.cap is not None else args.timeout

    def watch() -> None:
        if not stopper.done.wait(limit):
            stopper.stop("cap" if capped else "timeout")

    printed = io.StringIO()
    usage.start()
    threading.Thread(target=watch, name="cap-watch", daemon=True).start()
    with contextlib.redirect_stdout(printed):
        status = lite_push_main(argv)
    stopper.done.set()  # the command returned: the watcher has nothing left to stop
    usage.stop()  # unless the listener or the watcher took the mark already
    lines = printed.getvalue().strip().splitlines()
    print(printed.getvalue(), end="", file=sys.stderr)
    error = None
    if stopper.why == "timeout":
        error = f"timeout after {args.timeout:g}s ({calls.distinct} of {calls.total} handled)"
    elif status != 0:
        error = f"lite-push consume exited {status}: {lines[-1] if lines else '(no output)'}"
    elif stopper.why is None and not calls.done:
        error = f"lite-push consume stopped by itself ({calls.distinct} of {calls.total} handled)"
    write_out(
        args.out,
        usage,
        calls,
        capped=stopper.why == "cap",
        error=error,
        config={
            "package": f"lite-push=={importlib.metadata.version('lite-push')}",
            "source": source_name,
            "command": "lite-push " + " ".join(argv),
            **{k: v for k, v in settings.items() if v is not None},
            "listener": "async def: await asyncio.sleep(cost)",
            "exit_status": status,
            "last_line": lines[-1] if lines else None,
            "keeps_key_order": True,
        },
    )
    if config_file is not None:
        config_file.unlink(missing_ok=True)
    return 0

"""``lite-push produce``: standard input, one message per line, sent to a
topic that exists.

What a line is
    Standard input is read as bytes.  A line ends at ``\\n``; a ``\\r``
    before it is dropped too (a file written on Windows sends the same
    bodies), and a last line without a newline is a message as well.
    Every line is one message, an empty line one with an empty body, so
    ``wc -l`` counts what is sent.  With ``--key-separator SEP`` a line is
    ``KEY SEP BODY``, split at the first ``SEP`` (nothing is trimmed; an
    empty key sends a keyless message); a line without ``SEP``, a key that
    is not UTF-8 and a body over the source's size limit are errors naming
    the line (exit status 2), after every line before it was sent.
    ``--tags TAG`` gives every message that tag.

How it is sent
    Lines are gathered into batches (:data:`BATCH_LINES` lines or
    :data:`BATCH_BYTES` bytes of bodies) and each batch is one
    ``send_batch`` call; a batch also goes out as soon as no more input is
    waiting (``tail -f log | lite-push produce ...`` sends each line as it
    comes).  Batches are sent one after another, and every source sends a
    key's messages to one queue, so each key's messages are stored in
    input order.

Stopping
    End of input ends the command: ``sent N messages to T`` on stdout.
    Ctrl-C or SIGTERM stops it between two batches (a batch being sent is
    finished first; a second signal does not wait) with one line saying how
    many messages were sent and from which line on nothing was; exit status
    130 (SIGINT) or 143 (SIGTERM).  A source that fails says the same
    about what was sent before it (exit status 1).
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import IO, Any

from tqdm import tqdm

from .._errors import UnknownTopicError
from .._tracing import SendSpan, check_tracing, no_span, send_span, system_of
from ..sources import is_retry_or_dlq_topic
from .errors import CliError
from .sources import Broker, source_errors, unknown_topic
from .topic import bad_topic, source_and_topic

__all__ = ["BATCH_BYTES", "BATCH_LINES", "PROGRESS_DELAY", "READ_SIZE", "LineFormat", "cmd_produce", "sent_line"]

#: Most lines in one ``send_batch`` call.
BATCH_LINES = 1000
#: Most body bytes in one ``send_batch`` call (a batch has at least one line).
BATCH_BYTES = 1 << 20
#: Bytes asked of standard input per read.
READ_SIZE = 1 << 16
#: ``--progress auto``: the bar shows once sending has taken this many
#: seconds (a short input never shows one).
PROGRESS_DELAY = 1.0


class LineFormat:
    """How one input line becomes a ``send_batch`` item: split at
    ``separator`` (``None``: the whole line is the body), tagged with
    ``tag``, its body at most ``limit`` bytes."""

    __slots__ = ("limit", "separator", "tag")

    def __init__(self, separator: bytes | None, tag: str | None, limit: int) -> None:
        self.separator = separator
        self.tag = tag
        self.limit = limit

    def item(self, line: bytes) -> Any:
        """The item of one input line (its line end removed); ``ValueError``
        saying what is wrong with it."""
        key: str | None = None
        body = line
        if self.separator is not None:
            raw, sep, body = line.partition(self.separator)
            if not sep:
                raise ValueError(f"no key separator {self.separator.decode()!r} in it")
            try:
                key = raw.decode("utf-8") or None
            except UnicodeDecodeError:
                raise ValueError("its key is not UTF-8") from None
        if len(body) > self.limit:
            raise ValueError(f"its body has {len(body)} bytes, more than the source's limit of {self.limit}")
        if self.tag is not None:
            return {"body": body, "keys": key, "tags": self.tag}
        return body if key is None else (body, key)


class _InputError(Exception):
    """Standard input cannot be read on: a line without an end in sight
    (``line``: the input is at fault), or a read that fails."""

    def __init__(self, message: str, *, line: bool) -> None:
        super().__init__(message)
        self.line = line


def _lines(stream: IO[bytes], limit: int) -> Iterator[tuple[bytes, bool]]:
    """The lines of ``stream`` without their line ends, each with whether
    more input is waiting after it (``False``: a batch should go out before
    the next read may block).  :class:`_InputError` for a line over
    ``limit`` bytes that has not ended, or a read that fails."""
    fd = stream.fileno()
    rest = b""
    while True:
        try:
            chunk = os.read(fd, READ_SIZE)
        except OSError as e:
            raise _InputError(f"standard input: {e.strerror or e}", line=False) from None
        if not chunk:
            break
        lines = (rest + chunk).split(b"\n") if rest else chunk.split(b"\n")
        rest = lines.pop()
        if len(rest) > limit:
            raise _InputError(f"it has more than {limit} bytes and no end", line=True)
        last = len(lines) - 1
        for i, line in enumerate(lines):
            yield line[:-1] if line.endswith(b"\r") else line, i < last or _waiting(fd)
    if rest:
        yield rest[:-1] if rest.endswith(b"\r") else rest, False


def _waiting(fd: int) -> bool:
    """Whether input is ready on ``fd`` (a read would not block)."""
    try:
        ready, _, _ = select.select([fd], [], [], 0)
    except (OSError, ValueError):  # not selectable here: send what there is
        return False
    return bool(ready)


class _Reported(CliError):
    """A one-line error that already says what was sent."""


class _Stopped(BaseException):
    """A signal asked the command to stop (a ``BaseException``, like
    ``KeyboardInterrupt``: no ``except Exception`` on the way swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Signals:
    """SIGINT and SIGTERM stop the command between batches: while a batch
    is being sent (:attr:`sending`) the first signal waits for the send to
    end (:meth:`check`), a second does not."""

    def __init__(self) -> None:
        self.sending = False
        self.pending: int | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.sending and self.pending is None:
            self.pending = signum
            return
        raise _Stopped(signum)

    def check(self) -> None:
        """Raise the signal that came during a send."""
        if self.pending is not None:
            raise _Stopped(self.pending)


@contextmanager
def _signals_handled() -> Iterator[_Signals]:
    state = _Signals()
    previous = {s: signal.signal(s, state.handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield state
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class _Batches:
    """The batch being gathered and how many messages were sent (one per
    input line: the first :attr:`sent` lines)."""

    def __init__(self, broker: Broker, topic: str, signals: _Signals, bar: tqdm[Any], span: SendSpan = no_span) -> None:
        self.broker = broker
        #: Around each batch sent: its span, with ``--tracing``.
        self.span = span
        self.topic = topic
        self.signals = signals
        self.bar = bar
        self.items: list[Any] = []
        self.size = 0
        self.sent = 0

    def add(self, item: Any, size: int) -> None:
        self.items.append(item)
        self.size += size
        if len(self.items) >= BATCH_LINES or self.size >= BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Send the gathered batch; then stop if a signal came meanwhile."""
        if self.items:
            self.signals.sending = True
            with self.span(self.topic, len(self.items)):
                self.broker.send_batch(self.topic, self.items)
            self.sent += len(self.items)
            self.bar.update(len(self.items))
            self.items, self.size = [], 0
            self.signals.sending = False
        self.signals.check()

    def so_far(self) -> str:
        """What was sent, for the line that says why the command stopped."""
        n = self.sent
        text = sent_line(n, self.topic)
        if n:
            text += " (input line 1)" if n == 1 else f" (input lines 1 to {n})"
        if self.signals.sending:  # the send of the batch after them failed or was cut short
            text += f"; lines {n + 1} to {n + len(self.items)} may be partly stored"
        return text


def sent_line(n: int, topic: str) -> str:
    """``sent N messages to T`` (``1 message``)."""
    return f"sent {n} message{'' if n == 1 else 's'} to {topic}"


def _separator(text: str | None) -> bytes | None:
    if text is None:
        return None
    if not text:
        raise CliError("key-separator: must not be empty")
    if "\n" in text:
        raise CliError("key-separator: must not hold a newline (a message is one line)")
    return text.encode("utf-8")


def _tag(text: str | None) -> str | None:
    if text is None:
        return None
    if not text or any(c.isspace() or c in "|*" for c in text):
        raise CliError(
            f"tags: one tag without whitespace, '|' or '*' (a consumer's tag filter selects it), got {text!r}"
        )
    return text


def _bar(progress: str, topic: str) -> tqdm[Any]:
    """The progress bar on stderr: ``on`` always, ``off`` never, ``auto``
    when stderr is a terminal, stdin is not, and sending takes more than
    :data:`PROGRESS_DELAY` seconds."""
    disable: bool | None = {"on": False, "off": True}.get(progress)
    delay = 0.0
    if disable is None:
        disable = None if not sys.stdin.isatty() else True  # None: a terminal only
        delay = PROGRESS_DELAY
    return tqdm(desc=f"sending to {topic}", unit="msg", file=sys.stderr, disable=disable, delay=delay)


def _check_topic(broker: Broker, url: str, topic: str) -> None:
    """``topic`` exists on ``broker`` and takes messages from the command."""
    if is_retry_or_dlq_topic(topic):
        raise CliError(
            f"topic: {topic} is a group's retry or dead-letter topic; lite-push dlq resend sends dead letters "
            "back to their topics"
        )
    try:
        broker.queues(topic)
    except UnknownTopicError:
        hint = f"create it first: lite-push topic create --topic {topic} --queues N"
        raise unknown_topic(topic, url, broker, hint) from None
    except ValueError as e:  # a name this source cannot have (Kafka's rules)
        raise bad_topic(e) from None


def _send_lines(stdin: IO[bytes], fmt: LineFormat, batches: _Batches) -> None:
    """Send every line of ``stdin`` as ``fmt`` makes it, in ``batches``."""
    number = 0
    try:
        for number, (line, more) in enumerate(_lines(stdin, fmt.limit + READ_SIZE), 1):
            try:
                item = fmt.item(line)
            except ValueError as e:
                batches.flush()
                raise _Reported(f"line {number}: {e}; {batches.so_far()}") from None
            batches.add(item, len(line))
            if not more:
                batches.flush()
    except _InputError as e:
        batches.flush()
        if e.line:
            raise _Reported(f"line {number + 1}: {e}; {batches.so_far()}") from None
        raise _Reported(f"{e}; {batches.so_far()}", code=1) from None
    batches.flush()


def cmd_produce(args: argparse.Namespace) -> int:
    separator = _separator(args.key_separator)
    tag = _tag(args.tags)
    if sys.stdin is None:  # started with its standard input closed
        raise CliError("standard input is closed: nothing to send")
    broker, url, topic = source_and_topic(args)
    span: SendSpan = no_span
    if getattr(args, "tracing", False):
        broker.tracing = check_tracing(True)
        span = send_span(system_of(broker))
    batches: _Batches | None = None
    try:
        with source_errors(url, broker), _signals_handled() as signals:
            _check_topic(broker, url, topic)
            with _bar(args.progress, topic) as bar:
                batches = _Batches(broker, topic, signals, bar, span)
                _send_lines(sys.stdin.buffer, LineFormat(separator, tag, broker.max_message_size), batches)
    except _Stopped as e:
        sent = batches.so_far() if batches is not None else "nothing sent"
        raise CliError(f"stopped by {e}: {sent}", code=128 + e.signum) from None
    except CliError as e:
        if batches is None or e.code != 1 or isinstance(e, _Reported):
            raise
        raise CliError(f"{e}; {batches.so_far()}", code=1) from None  # the source failed
    finally:
        broker.close()
    _say(sent_line(batches.sent, topic))
    return 0


def _say(line: str) -> None:
    """Print the result on stdout; on stderr when stdout is a closed pipe."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error at exit
        os.close(devnull)
        print(line, file=sys.stderr, flush=True)

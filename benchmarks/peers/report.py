"""The grid's results as RESULTS.md's table and as a chart.

A row is one peer on one shape over ``--repeat`` rounds: the median rate
and its share of the hot-key bound, every round's rate, the medians of the
time to its first call ("start ms"), p99 latency, CPU seconds and peak RSS,
and the delivery counts summed over the rounds (``-`` where a count could
not be known).  A peer that did not run (no venv, ``UNRUNNABLE.md``) gets
one row per shape with its reason.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

__all__ = ["chart", "markdown", "summarize"]

COUNTS = ("lost", "duplicates", "order_violations", "overlaps")

#: What the columns mean, printed under the table.
NOTES = """\
msg/s: distinct messages handled over the seconds from the start of the peer's first call to the end of its last call \
(median of the rounds): its throughput once it consumes. start ms: from just before the peer's client was made to the \
start of its first call (connecting, joining the group, the first fetch; not in msg/s: quixstreams' replicas run on a \
mock cluster with Kafka's default initial rebalance delay of 3 s, which a fresh group waits on a broker, so that they \
form their group together; every other Kafka peer on one without a delay). A capped run (stopped --cap seconds after \
it started, then let finish what it held) is rated over what it handled; its % of the hot-key bound is against the \
bound of the whole topic. p99 ms: from when a message was there for this consumer (the topic is filled before the \
first one runs: the later of its send time and the run's start) to the end of its call, so with a backlog mostly how \
long it waited in it. CPU s: the runner's process and its children, start to last message; peak RSS: its largest \
resident set. lost: messages the group's committed offsets passed that were never handled (and, for a run neither \
capped nor failed, any message never handled); duplicates: calls beyond a message's first; order violations: per key, \
first deliveries out of offset order; overlaps: per key, a call that started before an earlier one ended. Counts are \
summed over the rounds; '-': the committed offsets could not be read."""


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarize(rows: list[dict[str, Any]], hot_rate: float) -> dict[str, Any]:
    """One peer's rounds on one shape."""
    rates = [float(r["rate"]) for r in rows]
    rate = statistics.median(rates) if rates else 0.0
    out: dict[str, Any] = {
        "rate": rate,
        "rates": rates,
        "of_bound": rate / hot_rate,
        "first_call_ms": _median(rows, "first_call_ms"),
        "p99_ms": _median(rows, "p99_ms"),
        "cpu_s": _median(rows, "cpu_s"),
        "peak_rss_mb": _median(rows, "peak_rss_mb"),
        "capped": sum(1 for r in rows if r.get("capped")),
        "errors": [r["error"] for r in rows if r.get("error")],
        "runs": len(rows),
        "config": rows[-1].get("config", {}) if rows else {},
    }
    for key in COUNTS:
        values = [r.get(key) for r in rows]
        out[key] = None if any(v is None for v in values) else sum(values)
    return out


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def markdown(shapes: dict[str, dict[str, Any]], not_run: dict[str, str]) -> str:
    """RESULTS.md's table: a row per peer and shape, then the reasons."""
    lines = [
        "| peer | shape | msg/s (median) | runs msg/s | % of hot-key bound | start ms | p99 ms | CPU s "
        "| peak RSS MB | lost | duplicates | order violations | overlaps | capped | keeps key order | version |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    notes: list[str] = []
    for shape, data in shapes.items():
        for peer, s in data["summary"].items():
            config = s["config"]
            if not s["rates"] or all(r == 0 for r in s["rates"]) and s["errors"]:
                lines.append(f"| {peer} | {shape} | not run: {s['errors'][0] if s['errors'] else '?'} |")
                continue
            keeps = config.get("keeps_key_order")
            cells = [
                peer,
                shape,
                f"{s['rate']:,.0f}",
                ", ".join(f"{r:,.0f}" for r in s["rates"]),
                f"{s['of_bound']:.1%}",
                _cell(s.get("first_call_ms"), ",.0f"),
                _cell(s["p99_ms"], ",.0f"),
                _cell(s["cpu_s"], ".1f"),
                _cell(s["peak_rss_mb"], ",.0f"),
                *(_cell(s[k], "d") for k in COUNTS),
                f"{s['capped']}/{s['runs']}",
                "-" if keeps is None else ("yes" if keeps else "no"),
                str(config.get("package", "-")),
            ]
            lines.append("| " + " | ".join(cells) + " |")
            notes += [f"- {peer} on {shape}: {e}" for e in s["errors"]]
    for shape in shapes:
        for peer, reason in not_run.items():
            lines.append(f"| {peer} | {shape} | not run: {reason} |")
    bounds = ", ".join(f"`{shape}` {data['hot_key_rate']:,.0f}" for shape, data in shapes.items())
    out = lines + ["", f"Hot-key bound (msg/s): {bounds}.", "", NOTES]
    if notes:
        out += ["", "Errors:", *notes]
    return "\n".join(out)


def chart(shapes: dict[str, dict[str, Any]], path: Path) -> None:
    """Grouped bars: each peer's median msg/s per shape, log scale, the
    shape's hot-key bound as a line across its group; a peer that does not
    keep per-key order has hatched bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(shapes)
    peers = sorted(
        {p for data in shapes.values() for p in data["summary"]}, key=lambda p: (not p.startswith("lite_push"), p)
    )
    width = 0.8 / max(1, len(peers))
    fig, ax = plt.subplots(figsize=(min(14.0, max(8.0, 0.3 * len(names) * len(peers))), 7.5))
    for i, peer in enumerate(peers):
        xs, ys = [], []
        keeps = True
        for j, shape in enumerate(names):
            s = shapes[shape]["summary"].get(peer)
            if s and s["rate"] > 0:
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(s["rate"])
                keeps = keeps and s["config"].get("keeps_key_order") is not False
        # hatched: a peer that does not keep per-key order (its bars are not bound by the hot key)
        ax.bar(
            xs,
            ys,
            width,
            label=peer if keeps else f"{peer} (no key order)",
            hatch=None if keeps else "//",
            color=plt.get_cmap("tab20")(i % 20),
            edgecolor="black",
            linewidth=0.3,
        )
    for j, shape in enumerate(names):
        bound = shapes[shape]["hot_key_rate"]
        label = "hot-key bound" if j == 0 else None
        ax.hlines(bound, j - 0.45, j + 0.45, colors="black", linestyles="dashed", label=label)
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("messages per second (median of rounds)")
    ax.set_title("Key-ordered throughput side by side, one broker per protocol")
    ax.legend(fontsize="small", ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

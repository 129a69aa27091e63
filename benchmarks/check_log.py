"""Check consumption logs against a workload with PySpark: loss, duplicates,
per-key order inversions and concurrent executions of one key, per run.

    .venv/bin/python benchmarks/check_log.py --workload benchmarks/out/sms --log benchmarks/out/sms-log

A consumption log is Parquet (one directory, any number of files, any number
of runs) with the columns

    run (string)  seq (long)  key (string)  queue (int)  offset (long)
    lane (int)  start_ns (long)  end_ns (long)  attempt (int, 0 = first delivery)

one row per delivery (listener call per message), ``seq`` being the
workload's ``seq`` of the delivered message.  Per run it reports:

* ``messages`` — rows of the workload;
* ``delivered`` — distinct workload seqs delivered;
* ``lost`` — workload seqs never delivered (``messages - delivered``);
* ``duplicates`` — deliveries of workload seqs beyond the first per seq;
* ``inversions`` — per key, the messages taken in workload ``seq`` order,
  consecutive *delivered* pairs (a, b) where b's earliest start is before the
  end of a's first delivery (lowest ``attempt``, then earliest start); a lost
  message is skipped, so its neighbours are compared.  A retry of a (a higher
  ``attempt``) is not waited for: b may start once a's first delivery ended;
* ``concurrent`` — per key, deliveries (ordered by start) that start while
  an earlier-started delivery of the same key is still running, i.e.
  ``start_ns < max(end_ns)`` of the key's earlier deliveries; intervals are
  half-open ``[start_ns, end_ns)``, so back-to-back is fine and an empty
  interval never overlaps.  One overlapping pair counts 1; k deliveries
  running at once count k-1;
* ``deliveries`` — rows of the run; ``unknown`` — deliveries whose seq is not
  in the workload; ``key_mismatch`` — deliveries whose logged key differs
  from the workload's key for that seq.

Keys for inversions and concurrency are the workload's (the logged key only
for unknown seqs).  Times are compared as given, so all deliveries of a run
must use one clock (e.g. ``time.perf_counter_ns`` or ``time.monotonic_ns``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the benchmark modules import each other flat: ``import gen_load``
    sys.path.insert(0, str(HERE))

from gen_load import spark_session

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["LOG_COLUMNS", "REPORT_COLUMNS", "check", "main", "read_logs", "to_markdown"]

#: The consumption log's columns and their Spark SQL types.
LOG_COLUMNS: dict[str, str] = {
    "run": "string",
    "seq": "long",
    "key": "string",
    "queue": "int",
    "offset": "long",
    "lane": "int",
    "start_ns": "long",
    "end_ns": "long",
    "attempt": "int",
}
#: Workloads up to this size are broadcast to the log join (no shuffle of the log for it).
BROADCAST_MAX_MESSAGES = 2_000_000
#: The keys of each report row, in table order.
REPORT_COLUMNS = (
    "run",
    "messages",
    "delivered",
    "lost",
    "duplicates",
    "inversions",
    "concurrent",
    "deliveries",
    "unknown",
    "key_mismatch",
)


def read_logs(spark: SparkSession, log_dirs: Sequence[str | os.PathLike[str]]) -> DataFrame:
    """The union of the logs, with the columns of :data:`LOG_COLUMNS` plus
    ``log_index`` (position of the directory in ``log_dirs``)."""
    from pyspark.sql import functions as F

    if not log_dirs:
        raise ValueError("at least one log directory is needed")
    frames = []
    for i, d in enumerate(log_dirs):
        df = spark.read.parquet(str(d))
        missing = [c for c in LOG_COLUMNS if c not in df.columns]
        if missing:
            raise ValueError(f"log {d} lacks columns {missing} (has {df.columns})")
        frames.append(
            df.select(*(F.col(c).cast(t).alias(c) for c, t in LOG_COLUMNS.items()), F.lit(i).alias("log_index"))
        )
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


def check(
    spark: SparkSession,
    workload_dir: str | os.PathLike[str],
    log_dirs: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
) -> list[dict[str, Any]]:
    """One report dict per run (keys :data:`REPORT_COLUMNS`, ints but
    ``run``), in the order the runs first appear in ``log_dirs``, then by
    name.  See the module docstring for the definitions."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if isinstance(log_dirs, (str, os.PathLike)):
        log_dirs = [log_dirs]
    workload = spark.read.parquet(str(workload_dir)).select(
        F.col("seq").cast("long").alias("seq"), F.col("key").cast("string").alias("wkey")
    )
    messages = workload.count()
    if messages <= BROADCAST_MAX_MESSAGES:
        workload = F.broadcast(workload)
    one = F.lit(1)
    zero = F.lit(0)
    # One shuffle (by run and key) and two sorts: everything below is a
    # window within (run, k), then one small aggregate per run.
    d = (
        read_logs(spark, log_dirs)
        .join(workload, "seq", "left")
        .withColumn("known", F.when(F.col("wkey").isNull(), zero).otherwise(one))
        .withColumn("k", F.coalesce(F.col("wkey"), F.col("key")))
        .repartition("run", "k")
    )
    # Sort 1: (run, k, known, seq, attempt, start_ns, end_ns).  Per message,
    # rn = 1 marks its first delivery; first_start is its earliest start.
    delivery = ("attempt", "start_ns", "end_ns")
    per_msg = Window.partitionBy("run", "k", "known", "seq").orderBy(*delivery)
    d = d.withColumn("rn", F.row_number().over(per_msg)).withColumn(
        "first_start", F.min("start_ns").over(per_msg.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing))
    )
    # prev_end: the end of the first delivery of the key's previous message
    # (the rows before a first delivery all belong to smaller seqs)
    by_seq = (
        Window.partitionBy("run", "k", "known").orderBy("seq", *delivery).rowsBetween(Window.unboundedPreceding, -1)
    )
    d = d.withColumn("prev_end", F.last(F.when(F.col("rn") == 1, F.col("end_ns")), ignorenulls=True).over(by_seq))
    # Sort 2: (run, k, start_ns, ...).  A delivery overlaps if it starts
    # before the running max end of the key's earlier-started deliveries.
    by_start = (
        Window.partitionBy("run", "k")
        .orderBy("start_ns", "end_ns", "seq", "attempt", "queue", "offset")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    overlap = (F.col("start_ns") < F.max("end_ns").over(by_start)) & (F.col("end_ns") > F.col("start_ns"))

    def count_if(cond: Column) -> Column:
        return F.sum(F.when(cond, one).otherwise(zero))

    known = F.col("known") == 1
    first = known & (F.col("rn") == 1)
    rows = (
        d.withColumn("overlap", overlap)
        .groupBy("run")
        .agg(
            F.min("log_index").alias("log_index"),
            F.count(one).alias("deliveries"),
            count_if(known).alias("known_deliveries"),
            count_if(first).alias("delivered"),
            count_if(~known).alias("unknown"),
            count_if(known & ~F.col("key").eqNullSafe(F.col("wkey"))).alias("key_mismatch"),
            count_if(first & (F.col("first_start") < F.col("prev_end"))).alias("inversions"),
            count_if(F.col("overlap")).alias("concurrent"),
        )
        .orderBy("log_index", "run")
        .collect()
    )

    report = []
    for r in rows:
        delivered = int(r["delivered"])
        report.append(
            {
                "run": r["run"],
                "messages": messages,
                "delivered": delivered,
                "lost": messages - delivered,
                "duplicates": int(r["known_deliveries"]) - delivered,
                "inversions": int(r["inversions"] or 0),
                "concurrent": int(r["concurrent"] or 0),
                "deliveries": int(r["deliveries"]),
                "unknown": int(r["unknown"]),
                "key_mismatch": int(r["key_mismatch"]),
            }
        )
    return report


def to_markdown(report: Sequence[dict[str, Any]]) -> str:
    """The report as a Markdown table."""
    lines = [
        "| " + " | ".join(REPORT_COLUMNS) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(REPORT_COLUMNS) - 1)) + "|",
    ]
    for row in report:
        cells = [str(row["run"])] + [f"{row[c]:,}" for c in REPORT_COLUMNS[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check consumption logs against a workload with PySpark.")
    parser.add_argument("--workload", required=True, help="workload directory written by gen_load.py")
    parser.add_argument("--log", required=True, action="append", help="consumption log directory (repeatable)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--json", help="also write the report as JSON to this file")
    args = parser.parse_args(argv)

    spark = spark_session(args.master, app_name="check_log")
    try:
        report = check(spark, args.workload, args.log)
    finally:
        spark.stop()
    print(to_markdown(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Generate a benchmark workload as Parquet with PySpark.

    .venv/bin/python benchmarks/gen_load.py sms --out benchmarks/out/sms
    .venv/bin/python benchmarks/gen_load.py sms-small --out /tmp/w --messages 5000 --master local[2]

Writes ``OUT/part-*.parquet`` with one row per message:

* ``seq`` (long): 0..N-1, the order the harness must send in;
* ``key`` (string): the key string of a rank sampled by the workload's skew
  (:func:`workloads.keys_for`: a 16-digit account-number-like id, or
  ``acct-<rank>`` with ``key_format="sequential"``);
* ``cost_us`` (int): the message's processing cost in microseconds;
* ``body_size`` (int): the body size in bytes;
* ``fail_times`` (int): listener attempts that fail before the message
  succeeds -- the workload's ``poison_failures`` for messages of a poisoned
  key (:func:`workloads.poisoned_ranks`), else 0 (always 0 when the workload
  has no poisoned keys).

and ``OUT/_workload.json`` (the :class:`~workloads.Workload`
fields; Spark and pyarrow skip files whose names start with ``_``).  The queue
is not in the file: the harness sends by key hash, as RocketMQ does.

Every random draw is a hash of ``(seq, seed, stream)`` (Spark's ``xxhash64``),
so the output depends only on the workload, never on partitioning or the
master.  Zipf ranks are drawn by inverse CDF on the exact pmf (a pandas UDF
with ``numpy.searchsorted`` over the broadcast cumulative table); ``hotkey``
puts rank 0 on ``hot_share`` of the rows and spreads the rest uniformly over
the other ranks.  Rows are written in ``seq`` order within each file and the
files in ``seq`` order by name, but readers should sort by ``seq`` anyway.
``redraw.py`` computes the same ``key`` and ``cost_us`` per ``seq`` in pure
Python (the same hashes and tables, no Spark), for tools that need the
message sequence without generating it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the benchmark modules import each other flat: ``import workloads``
    sys.path.insert(0, str(HERE))

from workloads import (
    LONGTAIL_SIGMA,
    WORKLOADS,
    Workload,
    cost_range_us,
    get_workload,
    hot_key_bound,
    key_pmf,
    keys_for,
    longtail_mu,
    poisoned_ranks,
    queue_of,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "WORKLOAD_JSON",
    "PoisonSummary",
    "generate",
    "main",
    "poison_summary",
    "read_workload",
    "spark_session",
    "workload_frame",
]

#: The workload description written beside the Parquet files.
WORKLOAD_JSON = "_workload.json"
#: Rows per output partition (file), at most.
ROWS_PER_PARTITION = 500_000

# Independent random streams: each draw hashes (seq, seed, stream).
_STREAM_KEY = 1
_STREAM_HOT = 2
_STREAM_COST_1 = 3
_STREAM_COST_2 = 4


def spark_session(
    master: str = "local[*]",
    app_name: str = "lite-push-bench",
    shuffle_partitions: int = 8,
    driver_memory: str = "2g",
) -> SparkSession:
    """A SparkSession for the benchmark jobs (or the active one if a session
    already exists).  Sets ``SPARK_LOCAL_IP=127.0.0.1`` and
    ``PYSPARK_PYTHON`` (this interpreter) unless already set; the UI is off,
    shuffle partitions small, Arrow on."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SystemExit(
            f"pyspark is not installed ({exc}); install the bench extra: pip install -e '.[bench]'"
        ) from exc
    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.driver.memory", driver_memory)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _uniform(seed: int, stream: int) -> Column:
    """A per-row uniform double in [0, 1) from ``xxhash64(seq, seed, stream)``
    (the top 53 bits)."""
    from pyspark.sql import functions as F

    h = F.xxhash64(F.col("seq"), F.lit(seed).cast("long"), F.lit(stream).cast("int"))
    return F.shiftrightunsigned(h, 11).cast("double") * F.lit(2.0**-53)


def _rank_column(workload: Workload) -> Column:
    """The key rank (int, 0 = hottest) of each row."""
    import numpy as np
    import pandas as pd
    from pyspark.sql import functions as F

    k = workload.keys
    u = _uniform(workload.seed, _STREAM_KEY)
    if workload.skew == "uniform":
        return F.least(F.floor(u * k), F.lit(k - 1)).cast("int")
    if workload.skew == "hotkey":
        rest = F.lit(1) + F.least(F.floor(u * (k - 1)), F.lit(k - 2))
        return F.when(_uniform(workload.seed, _STREAM_HOT) < workload.hot_share, F.lit(0)).otherwise(rest).cast("int")
    cdf = np.cumsum(np.asarray(key_pmf(workload), dtype=np.float64))
    cdf[-1] = 1.0
    last = k - 1

    def zipf_rank(us: pd.Series) -> pd.Series:
        # rank r  <=>  cdf[r-1] <= u < cdf[r]
        ranks = np.searchsorted(cdf, us.to_numpy(), side="right")
        return pd.Series(np.minimum(ranks, last).astype(np.int32))

    # real classes, not the strings ``from __future__ import annotations``
    # leaves (pandas is imported here, so Spark could not resolve them)
    zipf_rank.__annotations__ = {"us": pd.Series, "return": pd.Series}
    return F.pandas_udf(zipf_rank, "int")(u)  # type: ignore[call-overload]


def _cost_column(workload: Workload) -> Column:
    """The processing cost of each row in microseconds (int)."""
    from pyspark.sql import functions as F

    low, high = cost_range_us(workload)
    if workload.cost in ("none", "constant"):
        return F.lit(low).cast("int")
    u1 = _uniform(workload.seed, _STREAM_COST_1)
    if workload.cost == "uniform":
        return (F.lit(low) + F.least(F.floor(u1 * (high - low + 1)), F.lit(high - low))).cast("int")
    # longtail: lognormal exp(mu + sigma*Z) ms, Z by Box-Muller, capped
    u2 = _uniform(workload.seed, _STREAM_COST_2)
    z = F.sqrt(F.lit(-2.0) * F.log(F.lit(1.0) - u1)) * F.cos(F.lit(2 * math.pi) * u2)
    ms = F.exp(F.lit(longtail_mu(workload)) + F.lit(LONGTAIL_SIGMA) * z)
    return F.least(F.round(ms * 1000.0), F.lit(high)).cast("int")


def workload_frame(spark: SparkSession, workload: Workload, partitions: int | None = None) -> DataFrame:
    """The workload as a DataFrame (``seq``, ``key``, ``cost_us``,
    ``body_size``, ``fail_times``) in ``partitions`` partitions (default:
    from the size and the parallelism; the rows do not depend on it)."""
    import pandas as pd
    from pyspark.sql import functions as F

    n = workload.messages
    if partitions is None:
        parallelism = max(1, spark.sparkContext.defaultParallelism)
        partitions = max(1, min(parallelism * 2, math.ceil(n / 50_000)), math.ceil(n / ROWS_PER_PARTITION))
    elif partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    poisoned = poisoned_ranks(workload)
    fails = [workload.poison_failures if r in poisoned else 0 for r in range(workload.keys)]
    keys = spark.createDataFrame(
        pd.DataFrame(
            {
                "rank": pd.Series(range(workload.keys), dtype="int32"),
                "key": list(keys_for(workload)),
                "fail_times": pd.Series(fails, dtype="int32"),
            }
        )
    )
    rows = spark.range(0, n, numPartitions=partitions).withColumnRenamed("id", "seq")
    rows = rows.select("seq", _rank_column(workload).alias("rank"), _cost_column(workload).alias("cost_us"))
    return (
        rows.join(F.broadcast(keys), "rank")
        .select(
            F.col("seq").cast("long"),
            F.col("key").cast("string"),
            F.col("cost_us").cast("int"),
            F.lit(workload.body_size).cast("int").alias("body_size"),
            F.col("fail_times").cast("int"),
        )
        .sortWithinPartitions("seq")
    )


def generate(
    spark: SparkSession, workload: Workload, out_dir: str | os.PathLike[str], partitions: int | None = None
) -> Path:
    """Write ``workload`` to ``out_dir`` (replaced if it exists) as Parquet
    plus ``_workload.json``; returns the directory.  ``partitions`` (one file
    each) only changes the file split, never the rows."""
    out = Path(out_dir)
    workload_frame(spark, workload, partitions).write.mode("overwrite").parquet(str(out))
    (out / WORKLOAD_JSON).write_text(json.dumps(workload.to_dict(), indent=2) + "\n")
    return out


@dataclass(frozen=True)
class PoisonSummary:
    """How many generated messages the poisoned keys hold."""

    #: Poisoned keys (``round(keys * poison_keys)``), present in the data or not.
    keys: int
    #: Messages of poisoned keys (each fails ``poison_failures`` times first).
    messages: int
    #: Messages per poisoned key (key string -> count), largest first;
    #: poisoned keys that drew no message are left out.
    per_key: dict[str, int]
    #: Messages of poisoned keys per queue (``queue_of(key, queues)``).
    per_queue: dict[int, int]

    @property
    def largest_key(self) -> int:
        """Messages of the busiest poisoned key (0 if none)."""
        return max(self.per_key.values(), default=0)

    @property
    def largest_queue(self) -> int:
        """Poisoned messages in the queue that holds the most (0 if none)."""
        return max(self.per_queue.values(), default=0)


def poison_summary(out_dir: str | os.PathLike[str]) -> PoisonSummary:
    """Count the messages of poisoned keys in a generated workload (reads
    the ``key`` and ``fail_times`` columns with pyarrow; no Spark)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    workload = read_workload(out_dir)
    table = pq.read_table(str(out_dir), columns=["key", "fail_times"])
    keys = table.filter(pc.greater(table.column("fail_times"), 0)).column("key").to_pylist()
    per_key: dict[str, int] = {}
    per_queue: dict[int, int] = {}
    for key in keys:
        per_key[key] = per_key.get(key, 0) + 1
        q = queue_of(key, workload.queues)
        per_queue[q] = per_queue.get(q, 0) + 1
    return PoisonSummary(
        keys=len(poisoned_ranks(workload)),
        messages=len(keys),
        per_key=dict(sorted(per_key.items(), key=lambda kv: (-kv[1], kv[0]))),
        per_queue=dict(sorted(per_queue.items())),
    )


def read_workload(out_dir: str | os.PathLike[str]) -> Workload:
    """The :class:`Workload` stored in ``out_dir/_workload.json``."""
    return Workload.from_dict(json.loads((Path(out_dir) / WORKLOAD_JSON).read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate a benchmark workload as Parquet with PySpark.")
    parser.add_argument("workload", choices=list(WORKLOADS), metavar="WORKLOAD", help=", ".join(WORKLOADS))
    parser.add_argument("--out", required=True, help="output directory (replaced)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--messages", type=int, help="override the message count")
    parser.add_argument("--seed", type=int, help="override the seed")
    args = parser.parse_args(argv)

    workload = get_workload(args.workload)
    changes: dict[str, Any] = {}
    if args.messages is not None:
        changes["messages"] = args.messages
    if args.seed is not None:
        changes["seed"] = args.seed
    try:
        workload = workload.replace(**changes)
    except ValueError as exc:
        parser.error(str(exc))

    spark = spark_session(args.master, app_name=f"gen_load {workload.name}")
    try:
        t0 = time.perf_counter()
        out = generate(spark, workload, args.out)
        seconds = time.perf_counter() - t0
    finally:
        spark.stop()
    top_share, ceiling = hot_key_bound(workload)
    bound = f"key-ordered ceiling {ceiling:.2f}x the baseline" if workload.cost != "none" else "no processing cost"
    print(
        f"{workload.name}: {workload.messages:,} messages, {workload.keys:,} keys ({workload.skew}), "
        f"{workload.queues} queues, cost {workload.cost} -> {out} in {seconds:.1f} s; "
        f"hottest key {top_share:.2%} of messages, {bound}"
    )
    if workload.poison_keys > 0:
        ps = poison_summary(out)
        print(
            f"poisoned: {ps.keys} keys (ranks {sorted(poisoned_ranks(workload))}) hold {ps.messages:,} messages, "
            f"each failing {workload.poison_failures}x first; largest key {ps.largest_key}, "
            f"busiest queue {ps.largest_queue}; per key {list(ps.per_key.values())}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

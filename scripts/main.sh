#!/usr/bin/env bash
# The main job: bootstrap with the [bench] extra, then the side-by-side
# benchmark on a small workload (a few minutes): Spark generates the load,
# the QUEUE_ORDERLY baseline and lite_push's modes consume it one after
# another, Spark checks every consumption log, and the table is printed.
# Arguments replace the defaults, e.g.  scripts/main.sh sms --runs QUEUE_ORDERLY:20,KEY_ORDERLY:64
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/bootstrap.sh --bench

# PySpark starts its Python workers with $PYSPARK_PYTHON (default: python3 on
# PATH, which lacks the venv's pandas/pyarrow); point it at the venv.
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$PWD/.venv/bin/python}"

if [[ $# -eq 0 ]]; then
    set -- sms-small --runs QUEUE_ORDERLY:20,KEY_ORDERLY:16,KEY_ORDERLY:64,CONCURRENTLY:64
fi
exec .venv/bin/python benchmarks/bench.py "$@"

#!/usr/bin/env bash
# The main job: bootstrap with the [bench] extra, then run the demo
# (lite_push.demo; it grows into the side-by-side benchmark).  Arguments are
# passed to it.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/bootstrap.sh --bench

# PySpark starts its Python workers with $PYSPARK_PYTHON (default: python3 on
# PATH, which lacks the venv's pandas/pyarrow); point it at the venv.
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$PWD/.venv/bin/python}"

exec .venv/bin/python -m lite_push.demo "$@"

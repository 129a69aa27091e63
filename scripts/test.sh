#!/usr/bin/env bash
# Run the test suite: bootstrap, ruff and mypy, then pytest with any arguments given, e.g.
#
#   scripts/test.sh                         everything
#   scripts/test.sh -q tests/test_build.py  one file (paths are from the repo root)
#
# Unless LITE_PUSH_NO_EXTENSIONS is set, the compiled kernels are required:
# a missing one fails the tests instead of skipping the compiled cases.
# "No tests collected" (pytest's exit code 5) is a failure too.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# --bench: the Spark load generator and log checker are tested too.
bash scripts/bootstrap.sh --bench

if [[ -z ${LITE_PUSH_NO_EXTENSIONS:-} ]]; then
    export LITE_PUSH_REQUIRE_EXTENSIONS=1
fi

# Lint and type-check first (configured in pyproject.toml): a finding fails the run.
.venv/bin/ruff check .
.venv/bin/ruff format --check .  # laid out by the formatter, no hand-packed argument lists
.venv/bin/mypy

# A crash of the interpreter, even after the last test (at exit, while the
# threads of the libraries under test wind down), prints every thread's
# Python stack: pytest's own fault handler is off again by then.
export PYTHONFAULTHANDLER=1

rc=0
.venv/bin/python -m pytest "$@" || rc=$?
if [[ $rc -eq 5 ]]; then
    echo "test.sh: pytest collected no tests (exit code 5); treating that as a failure" >&2
    exit 1
fi
exit "$rc"

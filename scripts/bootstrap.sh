#!/usr/bin/env bash
# Set up a checkout to run lite_push: idempotent, safe to run from any cwd.
#
#   scripts/bootstrap.sh           redis-server, prometheus, .venv, lite-push[test,uvloop,redis,kafka]
#   scripts/bootstrap.sh --bench   ... plus the [bench] extra (PySpark, pandas, ...) and, when
#                                  `java` is missing, a Java runtime for PySpark (openjdk-17-jre-headless)
#
# The package is installed editable, so the compiled kernels (_ext/*.pyx) are
# built in place into lite_push/_kernels/.  A compile error fails the script; so does a
# compiled module that does not import afterwards.  LITE_PUSH_NO_EXTENSIONS=1
# builds none (and removes stale ones) for a pure-Python run.
#
# A second run with nothing changed only checks: the install is skipped while
# pyproject.toml, setup.py, _ext/*.pyx and *.h, the extras and LITE_PUSH_NO_EXTENSIONS
# are the same as at the last successful install.
set -euo pipefail
shopt -s nullglob

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# say, die, apt_install, ensure_java
source scripts/system_packages.sh

extras="test,uvloop,redis,kafka"
bench=
for arg in "$@"; do
    case "$arg" in
        --bench) extras="$extras,bench" bench=1 ;;
        -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
        *) die "unknown argument: $arg (expected --bench)" ;;
    esac
done

# --- redis-server and prometheus ----------------------------------------------
# The tests start their own servers on free loopback ports (redis-server for
# the Redis source, prometheus for the dashboard test), so whether the Debian
# packages' services start (or are running) does not matter; they are kept
# from starting during the install where we can, so the install cannot fail on it.
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
if ((${#missing[@]})); then
    sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null 2>&1 || die "${missing[*]} missing and sudo is not available"
        sudo=(sudo)
    fi
    say "installing ${missing[*]} with apt-get"
    policy=/usr/sbin/policy-rc.d
    if [[ ! -e $policy ]]; then
        # Debian's invoke-rc.d consults this file; exit 101 = "do not start".
        "${sudo[@]}" sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"
        trap '"${sudo[@]}" rm -f '"$policy" EXIT
    fi
    apt_install "${missing[@]}"
    for exe in "${missing[@]}"; do
        command -v "$exe" >/dev/null 2>&1 || die "$exe still not on PATH after apt-get install"
    done
fi

# --- java (--bench: PySpark runs on the JVM) ------------------------------------
# bash scripts/main.sh (Spark generates the load and checks the logs) and
# bash scripts/test.sh (the Spark jobs' tests) both bootstrap with --bench.
if [[ -n $bench ]]; then
    ensure_java
fi

# --- .venv ----------------------------------------------------------------------
venv_ok() {
    [[ -x .venv/bin/python ]] &&
        .venv/bin/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null
}
if ! venv_ok; then
    if command -v python3.11 >/dev/null 2>&1; then
        py=python3.11
    elif python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
        py=python3
    else
        die "Python 3.11 not found (neither python3.11 nor python3 is 3.11)"
    fi
    say "creating .venv with $($py -c 'import sys; print(sys.executable, sys.version.split()[0])')"
    rm -rf .venv
    "$py" -m venv .venv
    rm -f .venv/.lite-push-installed
fi

# --- the package ------------------------------------------------------------------
stems=()
for pyx in _ext/*.pyx; do
    [[ -e $pyx ]] && stems+=("$(basename "$pyx" .pyx)")
done

check_imports() {
    local stem
    for stem in "${stems[@]}"; do
        .venv/bin/python -c "import lite_push._kernels.$stem" || return 1
    done
}

no_ext="${LITE_PUSH_NO_EXTENSIONS:-}"
stamp=.venv/.lite-push-installed
# The stamp's first line identifies the build inputs, the second lists the
# extras installed with them (a --bench install also serves a plain run).
want="$(cat pyproject.toml setup.py _ext/*.pyx _ext/*.h 2>/dev/null | sha256sum | cut -d' ' -f1) no_ext=$no_ext"

up_to_date() {
    [[ -f $stamp && "$(sed -n 1p "$stamp")" == "$want" ]] || return 1
    local have extra
    have=",$(sed -n 2p "$stamp"),"
    for extra in ${extras//,/ }; do
        [[ $have == *",$extra,"* ]] || return 1
    done
    [[ -n $no_ext ]] || check_imports 2>/dev/null
}

if up_to_date; then
    say "up to date (.venv, lite-push[$(sed -n 2p "$stamp")])"
else
    log=.venv/bootstrap-pip.log
    say "installing lite-push[$extras] (editable; log: $log)"
    if [[ -n $no_ext ]]; then
        # A pure-Python build: drop compiled modules left by an earlier build.
        for stem in "${stems[@]}"; do rm -f lite_push/_kernels/"$stem".*.so; done
    fi
    rm -f "$stamp"
    if ! { .venv/bin/python -m pip install --upgrade pip &&
        .venv/bin/python -m pip install --progress-bar off -e ".[$extras]"; } >"$log" 2>&1; then
        tail -n 60 "$log" >&2
        die "pip install failed (full log: $log)"
    fi
    if [[ -z $no_ext ]]; then
        [[ ${#stems[@]} -gt 0 ]] || die "no _ext/*.pyx to build"
        check_imports || die "a compiled module (lite_push._kernels.{$(IFS=,; echo "${stems[*]}")}) does not import; see the error above"
    fi
    printf '%s\n%s\n' "$want" "$extras" >"$stamp"
fi

if [[ -z $no_ext ]]; then
    say "compiled: $(IFS=' '; echo "${stems[*]}")"
else
    say "LITE_PUSH_NO_EXTENSIONS is set: pure-Python twins only"
fi

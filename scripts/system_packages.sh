# What scripts/bootstrap.sh installs outside the venv, with apt-get.
# Sourced (it only defines functions): bash scripts/bootstrap.sh uses them,
# and tests/test_bootstrap_java.py runs them with a fake apt-get on PATH.
#
#   apt_install PKG...   apt-get update, then install PKG... (sudo when not root);
#                        the tail of apt's log and exit 1 when that fails
#   java_major           the major version of the `java` on PATH (17, 21, 8), or fails
#   ensure_java          PySpark's Java: install $JAVA_PACKAGE when `java` is missing

say() { printf 'bootstrap: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

# PySpark 4.0 runs on Java 17 or 21, 3.5 on 8, 11 or 17 (pyproject.toml's
# [bench] extra allows both lines): 17 serves either. Debian 12 packages it
# as openjdk-17-jre-headless; JAVA_PACKAGE names another (openjdk-21-jre-headless
# where 17 is not packaged).
JAVA_PACKAGE=${JAVA_PACKAGE:-openjdk-17-jre-headless}
JAVA_SUPPORTED=(17 21)

# apt-get with sudo when not root.
apt_get() {
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null 2>&1 || die "apt-get needs root, and sudo is not available"
        sudo=(sudo)
    fi
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "$@"
}

apt_install() {
    local apt_log
    apt_log=$(mktemp)
    if ! { apt_get update -qq && apt_get install -y -qq --no-install-recommends "$@"; } >"$apt_log" 2>&1; then
        tail -n 40 "$apt_log" >&2
        rm -f "$apt_log"
        die "apt-get install $* failed"
    fi
    rm -f "$apt_log"
}

java_major() {
    command -v java >/dev/null 2>&1 || return 1
    local out
    out=$(java -version 2>&1) || return 1
    # openjdk version "17.0.15" 2025-04-15 | java version "1.8.0_402"
    [[ $out =~ version\ \"([0-9]+)(\.([0-9]+))? ]] || return 1
    if [[ ${BASH_REMATCH[1]} == 1 ]]; then
        echo "${BASH_REMATCH[3]}"
    else
        echo "${BASH_REMATCH[1]}"
    fi
}

ensure_java() {
    local major
    if major=$(java_major); then
        if [[ " ${JAVA_SUPPORTED[*]} " != *" $major "* ]]; then
            say "java $major is on PATH; PySpark wants ${JAVA_SUPPORTED[*]} (install $JAVA_PACKAGE, or set JAVA_HOME)"
        fi
        return 0
    fi
    say "installing $JAVA_PACKAGE with apt-get (PySpark needs a Java runtime)"
    apt_install "$JAVA_PACKAGE"
    major=$(java_major) || die "java still not on PATH after apt-get install $JAVA_PACKAGE"
    say "java $major installed"
}

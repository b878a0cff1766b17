#!/usr/bin/env bash
# memplan's one entry point for people and CI. Sets up .venv (once), then:
#   ./dev.sh demo   profile, plan, run and compare a built-in model on the CPU (the main job)
#   ./dev.sh test   the test suite, one test file per worker process on every core (at most 4;
#                   MEMPLAN_TEST_WORKERS=N sets the count, 1 runs it in this process alone)
#   ./dev.sh bench [NAME [ARGS]]  the benchmarks, or benchmarks/bench_NAME.py alone (docs/benchmarks.md)
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
VENV=${VENV:-.venv}
STAMP="$VENV/.memplan-installed"

setup() {
    if [ ! -x "$VENV/bin/python" ]; then
        "$PYTHON" -m venv "$VENV"
    fi
    if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
        echo "memplan: installing into $VENV (first run only; log in $VENV/install.log)" >&2
        {
            "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip &&
            # the CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build
            "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0" &&
            "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[dev,features,ray]"
        } >"$VENV/install.log" 2>&1 || { cat "$VENV/install.log" >&2; echo "memplan: install failed" >&2; exit 1; }
        touch "$STAMP"
    fi
}

browser() {
    # the page's browser tests drive Debian's Chromium: install it only if missing, as root, with apt
    if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "memplan: installing chromium for the browser tests (log in $VENV/apt.log)" >&2
        { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; } \
            >"$VENV/apt.log" 2>&1 || echo "memplan: chromium not installed; the browser tests will skip" >&2
    fi
}

cmd=${1:-demo}
shift || true
case "$cmd" in
    setup) setup ;;
    demo)
        setup
        exec "$VENV/bin/python" -m memplan.demo "$@"
        ;;
    test)
        setup
        browser
        workers=${MEMPLAN_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}
        case "$workers" in
            '' | *[!0-9]*)
                echo "memplan: MEMPLAN_TEST_WORKERS must be a whole number of processes, got '$workers'" >&2
                exit 2
                ;;
        esac
        [ -z "${MEMPLAN_TEST_WORKERS:-}" ] && [ "$workers" -gt 4 ] && workers=4
        if [ "$workers" -gt 1 ]; then
            # a file's tests stay together in one worker (--dist loadfile): module fixtures run once
            exec "$VENV/bin/python" -m pytest -q -n "$workers" --dist loadfile "$@"
        fi
        exec "$VENV/bin/python" -m pytest -q "$@"
        ;;
    bench)
        setup
        if [ $# -gt 0 ] && [ -f "benchmarks/bench_$1.py" ]; then
            name=$1
            shift
            exec "$VENV/bin/python" "benchmarks/bench_$name.py" "$@"
        fi
        for b in benchmarks/bench_*.py; do "$VENV/bin/python" "$b"; done
        ;;
    *)
        echo "usage: ./dev.sh demo | test [PYTEST ARGS] | bench [NAME [ARGS]] | setup" >&2
        exit 2
        ;;
esac

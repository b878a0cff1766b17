#!/usr/bin/env bash
# The wheel as a user gets it: build it, install it into a fresh venv (torch's CPU build first),
# and, from outside the repository, check its import names and run a plan. Exits non-zero on any
# failure. Called by .ci/run; `bash scripts/check_wheel.sh` runs it by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

"$REPO/.venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$WORK/dist" "$REPO"
WHEEL=$(ls "$WORK"/dist/memplan-*.whl)
echo "check_wheel: built $(basename "$WHEEL")"

# 1. exactly one top-level import name, and the data and spec inside
"$REPO/.venv/bin/python" - "$WHEEL" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
assert tops == {"memplan"}, f"top-level names in the wheel: {sorted(tops)} (want only memplan)"
for need in ("memplan/data/chinchilla_epoch_extracted.csv", "memplan/planner/optimal.py",
             "memplan/profiler/measure.py", "memplan/executor/run.py", "memplan/service/app.py"):
    assert need in names, f"{need} is not in the wheel"
print(f"check_wheel: {len(names)} files, top-level import names {sorted(tops)}")
PY

# 2. a fresh venv, outside the repository
"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0"
"$WORK/venv/bin/python" -m pip install -q --disable-pip-version-check "$WHEEL"
cd "$WORK"
"$WORK/venv/bin/python" - <<'PY'
import importlib.util, sys
import memplan
assert "torch" not in sys.modules, "import memplan loaded torch"
for name in ("planner", "profiler", "executor", "service"):
    assert importlib.util.find_spec(name) is None, f"import {name} works outside the repository"
assert memplan.plan is not None and memplan.size is not None
print("check_wheel: import memplan is light; planner, profiler, executor, service are not importable")
PY
"$WORK/venv/bin/memplan" plan "$REPO/examples/gpt24.json" --budget 6GiB
"$WORK/venv/bin/memplan" fit --dataset epoch --json > "$WORK/fit.json"
"$WORK/venv/bin/python" -c "import json,sys; f=json.load(open('$WORK/fit.json')); print('check_wheel: fit --dataset epoch: A %.1f B %.1f E %.4f alpha %.4f beta %.4f' % (f['A'], f['B'], f['E'], f['alpha'], f['beta']))"
echo "check_wheel: ok"

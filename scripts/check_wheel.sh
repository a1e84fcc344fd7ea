#!/usr/bin/env bash
# The installed package works on its own, in both its installs: build a wheel from this tree, then
#
#   full:  a fresh virtual environment with `pip install '<wheel>[torch]' torch==2.13.0` (the torch
#          extra, pinned to the CPU build) runs `gpudoctor check --device cpu --ranks 2`: exit 0;
#   light: a fresh virtual environment with `pip install <wheel>` alone: torch must not come along;
#          `check --device cpu --ranks 2` there is GD002 naming the extra (exit 1); `report` on a
#          shipped recording works (exit 0); and the same check with `--python <the full env's
#          python>` runs its ranks in that interpreter, which has torch: exit 0.
#
# Every command runs from outside the source tree (so nothing is imported from it). On a machine
# without an NVIDIA driver the CPU runs report GD101 as a skip: the user asked for CPU.
#
#   bash scripts/check_wheel.sh            (TORCH_SPEC=torch==2.13.0 by default; .ci/run calls it)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
torch_spec="${TORCH_SPEC:-torch==2.13.0}"
python="${PYTHON:-python3}"
work="$(mktemp -d "${TMPDIR:-/tmp}/gpudoctor-wheel.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

echo "check_wheel: building the wheel"
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$work/wheel" "$repo"
wheel=$(ls "$work"/wheel/gpudoctor-*.whl)
echo "check_wheel: $(basename "$wheel")"
listing=$("$python" -m zipfile -l "$wheel")
for must in gpudoctor/py.typed gpudoctor/schemas/report.schema.json gpudoctor/schemas/bench.schema.json \
  gpudoctor/watch/ui/app.tcss gpudoctor/watch/samples/straggler.jsonl.gz LICENSE; do
  if ! grep -q "$must" <<<"$listing"; then
    echo "check_wheel: $must is not in the wheel" >&2
    exit 1
  fi
done

fail() {
  echo "check_wheel: $*" >&2
  exit 1
}

# run NAME EXPECTED_EXIT CMD...: run CMD from $work, its output kept in $work/NAME.out
run() {
  local name=$1 want=$2
  shift 2
  echo "check_wheel: $* (want exit $want)"
  set +e
  (cd "$work" && "$@") >"$work/$name.out" 2>&1
  local rc=$?
  set -e
  tail -n 3 "$work/$name.out"
  [ "$rc" -eq "$want" ] || { cat "$work/$name.out" >&2; fail "$name: exit $rc, wanted $want"; }
}

echo "check_wheel: full install: fresh venv, pip install '<wheel>[torch]' $torch_spec"
"$python" -m venv "$work/full"
"$work/full/bin/python" -m pip install --quiet "${wheel}[torch]" "$torch_spec"
if "$work/full/bin/python" -c "import numpy" 2>/dev/null; then
  echo "check_wheel: note: numpy came along as a dependency of something"
fi
run full 0 "$work/full/bin/gpudoctor" check --device cpu --ranks 2 --timeout 180

echo "check_wheel: light install: fresh venv, pip install <wheel>"
"$python" -m venv "$work/light"
"$work/light/bin/python" -m pip install --quiet "$wheel"
if "$work/light/bin/python" -c "import torch" 2>/dev/null; then
  fail "torch came along with the light install"
fi
run light-check 1 "$work/light/bin/gpudoctor" check --device cpu --ranks 2
grep -q "GD002" "$work/light-check.out" && grep -q "gpudoctor\[torch\]" "$work/light-check.out" ||
  fail "the light install's check does not name GD002 and the torch extra"
run light-report 0 "$work/light/bin/gpudoctor" report sample:straggler
run light-python 0 "$work/light/bin/gpudoctor" check --device cpu --ranks 2 --timeout 180 --python "$work/full/bin/python"
echo "check_wheel: both installs work"

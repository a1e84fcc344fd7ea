#!/usr/bin/env bash
# The installed package works on its own: build a wheel from this tree, install it into a fresh
# virtual environment with nothing but `pip install <wheel> torch==2.13.0` (its declared
# dependencies come along; numpy, the test extra and the source tree do not), then run
#   gpudoctor check --device cpu --ranks 2
# from outside the source tree (so nothing is imported from it) and require exit 0. On a machine
# without an NVIDIA driver that run reports GD101 as a skip: the user asked for CPU.
#
#   bash scripts/check_wheel.sh            (TORCH_SPEC=torch==2.13.0 by default; .ci/run calls it)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
torch_spec="${TORCH_SPEC:-torch==2.13.0}"
python="${PYTHON:-python3}"
work="$(mktemp -d "${TMPDIR:-/tmp}/gpudoctor-wheel.XXXXXX")"
trap 'rm -rf "$work"' EXIT

echo "check_wheel: building the wheel"
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$work/wheel" "$repo"
wheel=$(ls "$work"/wheel/gpudoctor-*.whl)
echo "check_wheel: $(basename "$wheel")"
listing=$("$python" -m zipfile -l "$wheel")
for must in gpudoctor/py.typed gpudoctor/schemas/report.schema.json gpudoctor/watch/app.tcss LICENSE; do
  if ! grep -q "$must" <<<"$listing"; then
    echo "check_wheel: $must is not in the wheel" >&2
    exit 1
  fi
done

echo "check_wheel: fresh venv, pip install <wheel> $torch_spec"
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet "$wheel" "$torch_spec"
if "$work/venv/bin/python" -c "import numpy" 2>/dev/null; then
  echo "check_wheel: note: numpy came along as a dependency of something"
fi

echo "check_wheel: gpudoctor check --device cpu --ranks 2"
cd "$work"
set +e
OMP_NUM_THREADS=1 "$work/venv/bin/gpudoctor" check --device cpu --ranks 2 --timeout 180
rc=$?
set -e
echo "check_wheel: exit $rc"
exit "$rc"

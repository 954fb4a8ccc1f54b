#!/usr/bin/env bash
# The first run on a GPU machine: ops/gpu_smoke.py under $PYTHON (default python3). Its
# docstring (`bash ops/gpu_smoke.sh --help`) says what each step checks and what it writes.
#
#   bash ops/gpu_smoke.sh              # on the GPU machine; then read runs/gpu_smoke/summary.md
#   bash ops/gpu_smoke.sh --toy        # = SMOKE_TOY=1: CPU rehearsal at toy sizes (gloo)
#   ONLY=env,model_05b bash ops/gpu_smoke.sh      # only these steps (the others are listed SKIP)
cd "$(dirname "$0")/.." || exit 2
PYTHON=${PYTHON:-python3}
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "gpu_smoke: no $PYTHON (set PYTHON=...)" >&2
    exit 2
fi
exec "$PYTHON" ops/gpu_smoke.py "$@"

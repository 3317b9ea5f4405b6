#!/usr/bin/env bash
# GPU proof kit: prove the collection's NVIDIA code paths on this host (tests/gpu/README.md).
#
#   tests/gpu/run.sh [OUT_DIR]
#
# OUT_DIR defaults to $OUT, else ./gpu-proof-out. PYTHON picks the interpreter (default python3:
# the one with nvidia-ml-py and PyTorch or CuPy). Reads the GPU and runs user-space CUDA and MPS
# processes only; never changes a GPU setting. At most 8 minutes: the kit stops starting checks
# after its budget (GPU_PROOF_BUDGET_S, default 420 s), gets SIGTERM at 480 s (only the kit:
# --foreground, so the signal arrives once and the kit cleans up its own process groups) and
# SIGKILL 10 s later.
# Exit status: 0 no item failed (also: no NVIDIA driver, every check skipped), 1 an item failed,
# 2 the kit broke.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:-${OUT:-$PWD/gpu-proof-out}}
python=${PYTHON:-python3}
budget=${GPU_PROOF_BUDGET_S:-420}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

if ! command -v "$python" >/dev/null 2>&1 || ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
    echo "gpu-proof: PYTHON=$python is not a Python 3.9 or newer that runs here; set PYTHON to the interpreter with the host's CUDA stack" >&2
    exit 2
fi

if command -v timeout >/dev/null 2>&1; then
    exec timeout --foreground --kill-after=10 480 "$python" "$here/gpu_proof.py" --out "$out" --budget-s "$budget"
fi
exec "$python" "$here/gpu_proof.py" --out "$out" --budget-s "$budget"

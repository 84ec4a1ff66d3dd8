#!/usr/bin/env bash
# The CUDA path in one run (at most 8 minutes on one H200): the CUDA tests, 5 steps of `grpolab train`
# on a SmolLM2-135M-shaped model, `grpolab bench` against TRL on a Qwen2.5-0.5B-shaped model, the update
# phase's MFU, and a static-KV-cache / CUDA-graph decode. What each part does: benchmarks/gpu_check.py.
#
#   bash benchmarks/gpu_wheels.sh   # here, where pip reaches a registry: TRL & co. into .whl/
#   bash benchmarks/gpu.sh          # there, on the GPU machine (results in $OUT, else runs/gpu-check)
#   bash benchmarks/gpu.sh --dry-run --out /tmp/gpu-dry   # anywhere: the CPU, tiny models, seconds
#
# The wheels in .whl/ (when there are any) are installed first into /tmp/gpu-site, put on PYTHONPATH,
# except on a dry run, which uses the Python environment as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
dry=0
for a in "$@"; do [ "$a" = "--dry-run" ] && dry=1; done
if [ "$dry" = 0 ] && compgen -G ".whl/*.whl" >/dev/null; then
  echo "gpu.sh: installing $(ls .whl/*.whl | wc -l) wheels from .whl/ into /tmp/gpu-site"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site .whl/*.whl \
    || { echo "gpu.sh: installing the wheels of .whl/ failed" >&2; exit 1; }
  export PYTHONPATH="/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$PY" benchmarks/gpu_check.py "$@"

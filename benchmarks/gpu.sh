#!/usr/bin/env bash
# The CUDA path in one run (at most 8 minutes on one H200): the CUDA tests, 5 steps of `grpolab train`
# on a SmolLM2-135M-shaped model, `grpolab bench` against TRL on a Qwen2.5-0.5B-shaped model, the update
# phase's MFU, and a static-KV-cache / CUDA-graph decode. What each part does: benchmarks/gpu_check.py.
#
#   bash benchmarks/gpu.sh --fetch-wheels   # where pip reaches a registry: TRL & co. into .whl/
#   bash benchmarks/gpu.sh          # on the GPU machine (results in $OUT, else runs/gpu-check)
#   bash benchmarks/gpu.sh --dry-run --out /tmp/gpu-dry   # anywhere: the CPU, tiny models, seconds
#
# --fetch-wheels downloads, for a GPU machine without a package registry, the wheels of TRL and of what
# it and grpolab need beyond PyTorch and transformers (Python 3.12, x86-64, one version of each) into
# .whl/, which git ignores. The wheels in .whl/ (when there are any) are installed first into
# /tmp/gpu-site, put on PYTHONPATH, except on a dry run, which uses the Python environment as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fetch-wheels" ]; then
  PY=${PYTHON:-python3}
  WHEELS=(
    trl==1.16.0                        # grpolab bench --against trl
    datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19   # TRL's datasets
    peft==0.21.2                       # LoRA (pins grpolab's version)
    math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2   # the math reward
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1   # the tool reward
  )
  mkdir -p .whl
  base=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl)
  for w in "${WHEELS[@]}"; do
    if ! "$PY" -m pip download -q "${base[@]}" "$w"; then
      extra=()
      for n in 24 31 34 35 39; do extra+=(--platform "manylinux_2_${n}_x86_64"); done
      "$PY" -m pip download -q "${base[@]}" "${extra[@]}" "$w"
    fi
    echo "gpu.sh --fetch-wheels: $w"
  done
  du -sh .whl
  exit 0
fi
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

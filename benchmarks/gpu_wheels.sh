#!/usr/bin/env bash
# Fetch, here (where pip reaches a registry), the wheels that benchmarks/gpu.sh installs on the GPU
# machine, which has no registry: TRL and what it and grpolab need that the machine's image lacks
# (the image's package list: /work/.library/device/KINDS.md). Python 3.12, x86-64, one version of each.
# The command is the device README's; .whl/ is ignored by git (.gitignore) and travels with `carry`.
#
#   bash benchmarks/gpu_wheels.sh      # then, on the GPU machine: bash benchmarks/gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=(
  trl==1.16.0                        # grpolab bench --against trl
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19   # TRL's datasets (not in the image)
  peft==0.21.2                       # LoRA (the image has a peft; this pins grpolab's)
  math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2   # grpolab's math reward
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1   # grpolab's tool reward
)
mkdir -p .whl
base=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl)
for w in "${WHEELS[@]}"; do
  name=${w%%==*}
  if ! "$PY" -m pip download -q "${base[@]}" "$w"; then
    extra=()
    for n in 24 31 34 35 39; do extra+=(--platform "manylinux_2_${n}_x86_64"); done
    "$PY" -m pip download -q "${base[@]}" "${extra[@]}" "$w"
  fi
  echo "gpu_wheels.sh: $w"
done
ls -la .whl
du -sh .whl

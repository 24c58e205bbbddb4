#!/usr/bin/env bash
# GPU run of the engine benchmark, from one small carry (.whl-engine: monai + nibabel wheels for Python 3.12).
# Writes the full-size sample DeepEdit bundle, trains it on phantoms (so Dice against the baseline means something),
# then times fp32 eager vs the overlay and its variants, and click-to-mask in one process (stock vs rocm_zoo).
# Results land in $OUT/<bundle>/.
set -euo pipefail
STEPS=${STEPS:-200}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-engine/*.whl
export PYTHONPATH=$PWD/lib:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
python3 -m rocm_zoo.cli env
python3 -m rocm_zoo.cli sample --size full --train --train-steps "$STEPS" --no-spleen10 \
  --model-dir /tmp/zoo/model --studies /tmp/zoo/studies --truth /tmp/zoo/truth 2>&1 | grep -v -i warn | tail -5
python3 -m rocm_zoo.cli -v bench --bundle-dir /tmp/zoo/model/spleen_deepedit_annotation \
  --out "$OUT/spleen_deepedit_annotation" "$@" 2>&1 | grep -v -i "warn\|nvimg"
python3 -m rocm_zoo.cli bench-click --bundle-dir /tmp/zoo/model/spleen_deepedit_annotation \
  --out "$OUT/spleen_deepedit_annotation" --runs 10 --warmup 2 2>&1 | grep -v -i "warn\|nvimg"

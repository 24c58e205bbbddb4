#!/usr/bin/env bash
# GPU run of `rocm-zoo bench-train` from one small carry (.whl-engine: the monai, nibabel and pytorch-ignite wheels for
# Python 3.12; see docs/benchmarks.md). Full-size sample DeepEdit and wholeBody_ct bundles (seeded, untrained) and
# phantoms with labels in each bundle's numbering; per bundle: fp32 eager vs the training overlay, same seeds and data
# order; then DeepEdit clicks (the warm compiled inference network) alone and while wholeBody_ct trains on the same GPU.
# Results: $OUT/train_<bundle>.json. Arguments: bundles (default both). The carry, made here once:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 -d .whl-engine monai==1.6.1 nibabel pytorch-ignite==0.5.5
set -euo pipefail
EPOCHS=${EPOCHS:-3}
PHANTOMS=${PHANTOMS:-6}
CLICK_SECONDS=${CLICK_SECONDS:-40}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-engine/*.whl
export PYTHONPATH=$PWD/lib:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
python3 -m rocm_zoo.cli env
quiet() { grep -v -i "warn\|nvimg\|deprecat"; }
bundles=${*:-spleen_deepedit_annotation wholeBody_ct_segmentation}
for bundle in $(printf '%s\n' spleen_deepedit_annotation $bundles | sort -u); do  # DeepEdit answers the clicks
  python3 -m rocm_zoo.cli sample --size full --bundle "$bundle" --no-spleen10 --model-dir /tmp/zoo/model \
    --studies /tmp/zoo/studies --truth /tmp/zoo/truth 2>&1 | quiet | tail -2
done
for bundle in $bundles; do
  clicks=0
  [ "$bundle" = wholeBody_ct_segmentation ] && clicks=$CLICK_SECONDS
  python3 -m rocm_zoo.cli -v bench-train --model-dir /tmp/zoo/model --bundle "$bundle" --phantoms "$PHANTOMS" \
    --epochs "$EPOCHS" --click-seconds "$clicks" --device cuda --out "$OUT" 2>&1 | quiet | grep -v "Epoch: \|simulated" \
    | tail -40
done

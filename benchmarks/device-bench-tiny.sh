#!/usr/bin/env bash
# GPU run of `rocm-zoo bench` on the five tiny sample bundles with their committed phantom-trained weights: fp32 eager
# vs the overlay on the spleen_10-shaped phantom, each variant's label maps against fp32's by Dice per label (the
# agreement check on trained weights; tiny networks, so the times say little about the full-size ones). From one
# small carry (.whl-engine: see device-train-bench.sh). Results: $OUT/<bundle>/bench.json and bench.md.
set -euo pipefail
RUNS=${RUNS:-5}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-engine/*.whl
export PYTHONPATH=$PWD/lib:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv
python3 -m rocm_zoo.cli env
python3 -m rocm_zoo.cli sample --size tiny --no-spleen10 --model-dir /tmp/zoo/model --studies /tmp/zoo/studies \
  --truth /tmp/zoo/truth 2>&1 | grep -v -i warn | tail -3
for bundle in ${*:-spleen_deepedit_annotation vista3d wholeBody_ct_segmentation swin_unetr_btcv_segmentation \
    pancreas_ct_dints_segmentation}; do
  python3 -m rocm_zoo.cli bench --bundle-dir "/tmp/zoo/model/$bundle" --out "$OUT" --runs "$RUNS" \
    --warmup 2 2>&1 | grep -v -i "warn\|nvimg" | tail -12 || echo "$bundle failed"
done
rm -f "$OUT"/*/*-variant-*.json "$OUT"/*/bench.png  # $OUT brings back 8 files: the records first

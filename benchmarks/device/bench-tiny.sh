#!/usr/bin/env bash
# GPU run of `rocm-zoo bench` on the five tiny sample bundles with their committed phantom-trained weights: fp32 eager
# vs the overlay on the spleen_10-shaped phantom, each variant's label maps against fp32's by Dice per label (the
# agreement check on trained weights; tiny networks, so the times say little about the full-size ones). From one
# small carry (.whl-engine: see device/train-bench.sh). Results: $OUT/<bundle>/bench.json and bench.md.
set -euo pipefail
RUNS=${RUNS:-5}
source benchmarks/device/engine-setup.sh
python3 -m rocm_zoo.cli sample --size tiny --no-spleen10 --model-dir /tmp/zoo/model --studies /tmp/zoo/studies \
  --truth /tmp/zoo/truth 2>&1 | quiet | tail -3
for bundle in ${*:-spleen_deepedit_annotation vista3d wholeBody_ct_segmentation swin_unetr_btcv_segmentation \
    pancreas_ct_dints_segmentation}; do
  bench "$bundle" --runs "$RUNS" --warmup 2 | tail -12 || echo "$bundle failed"
done
rm -f "$OUT"/*/*-variant-*.json "$OUT"/*/bench.png  # $OUT brings back 8 files: the records first

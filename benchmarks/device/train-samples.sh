#!/usr/bin/env bash
# GPU run of `rocm-zoo train-sample` for the tiny VISTA3D, wholeBody_ct, swin_unetr_btcv and pancreas_ct_dints
# samples, at once (one process each; the H200's 16 cores feed their data loaders), from one small carry
# (.whl-engine: see device/train-bench.sh). Back in $OUT: per bundle <bundle>-tiny.pt (the fp16 weights with the
# run's record: copy it to lib/rocm_zoo/samples/weights/) and its log. Arguments: bundle:workers pairs (default the
# four). MINUTES (default 7) bounds each training; VISTA3D_MINUTES (default MINUTES) its own; RESUME=1 starts from
# the committed weights (rocm-zoo train-sample --resume).
set -euo pipefail
MINUTES=${MINUTES:-7}
source benchmarks/device/engine-setup.sh
export OMP_NUM_THREADS=2  # four trainings share 16 cores; their loader workers do the data work
runs=${*:-vista3d:6 wholeBody_ct_segmentation:2 swin_unetr_btcv_segmentation:3 pancreas_ct_dints_segmentation:2}
mkdir -p /tmp/train
for run in $runs; do
  bundle=${run%%:*} workers=${run##*:} minutes=$MINUTES interval=10
  [ "$bundle" = vista3d ] && minutes=${VISTA3D_MINUTES:-$MINUTES} interval=25
  python3 -m rocm_zoo.cli -v train-sample --bundle "$bundle" --device cuda --minutes "$minutes" --epochs 3000 \
    --phantoms 16 --val-interval "$interval" --workers "$workers" ${RESUME:+--resume} --out "/tmp/train/$bundle" \
    --work "/tmp/train/$bundle/work" > "/tmp/train/$bundle.log" 2>&1 &
done
wait || true
for run in $runs; do
  bundle=${run%%:*}
  cp "/tmp/train/$bundle/$bundle-tiny.pt" "$OUT/" || true
  grep -v "Epoch: \|warn\|Warn" "/tmp/train/$bundle.log" > "$OUT/$bundle.log" || true
  echo "== $bundle"; grep "rocm_zoo.training.runner\|rocm_zoo.samples.train_sample\|Error" "$OUT/$bundle.log" | tail -5
done

#!/usr/bin/env bash
# GPU run of `rocm-zoo train-sample` for the tiny VISTA3D, wholeBody_ct, swin_unetr_btcv and pancreas_ct_dints
# samples, the four at once (one process each; the H200 has 16 cores for their data loaders), from one small carry
# (.whl-engine: see device-train-bench.sh). Per bundle: $OUT/<bundle>/train_sample_<bundle>.json (the record) and
# <bundle>-tiny-weights.pt, which `rocm-zoo train-sample` also keeps as rocm_zoo/samples/weights/<bundle>-tiny.pt
# (copied to $OUT/weights/). Arguments: bundles (default the four). MINUTES (default 7) bounds each training.
set -euo pipefail
MINUTES=${MINUTES:-7}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-engine/*.whl
export PYTHONPATH=$PWD/lib:/tmp/site PYTHONUNBUFFERED=1 OMP_NUM_THREADS=3
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv
python3 -m rocm_zoo.cli env
bundles=${*:-vista3d wholeBody_ct_segmentation swin_unetr_btcv_segmentation pancreas_ct_dints_segmentation}
for bundle in $bundles; do
  python3 -m rocm_zoo.cli -v train-sample --bundle "$bundle" --device cuda --minutes "$MINUTES" --epochs 2000 \
    --phantoms 16 --val-interval "$([ "$bundle" = vista3d ] && echo 20 || echo 10)" --workers 3 --out "$OUT/$bundle" \
    > "$OUT/$bundle.log" 2>&1 &
done
wait || true
mkdir -p "$OUT/weights"
cp lib/rocm_zoo/samples/weights/*-tiny.pt "$OUT/weights/" 2>/dev/null || true
for bundle in $bundles; do
  echo "== $bundle"; grep "rocm_zoo.training.runner\|rocm_zoo.samples.train_bundle\|Error" "$OUT/$bundle.log" | tail -6
done

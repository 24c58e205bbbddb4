#!/usr/bin/env bash
# Batch segmentation end to end on the GPU machine: MONAI Label's stock BundleInferTask vs rocm_zoo, one study file to
# one label file (rocm-zoo bench-batch). Needs the server's wheels in /tmp/wheels, carried as for
# benchmarks/device/server-bench.sh (four calls with .whl-srv-1..4 while the machine stays warm); run this in the call
# that carries the last folder, or in a later one while /tmp/wheels is still there.
#   benchmarks/device/batch-bench.sh BUNDLE PHANTOMS [REPEATS] [SECONDS]   e.g. wholeBody_ct_segmentation spleen10,ct512x397 3
# PHANTOMS is a comma list; SECONDS bounds the run (default 540), and what was timed by then is kept.
# Results: $OUT/batch-BUNDLE/batch.json and batch.md (the phantoms stay in /tmp, away from the few files $OUT returns).
set -euo pipefail
bundle=$1 phantoms=$2 repeats=${3:-3} seconds=${4:-540}
source benchmarks/device/server-site.sh
[ -d "/tmp/zoo/model/$bundle" ] || python3 -m rocm_zoo.cli sample --size full --bundle "$bundle" --no-spleen10 \
  --model-dir /tmp/zoo/model --studies /tmp/zoo/studies --truth /tmp/zoo/truth 2>&1 | tail -1
phantom_args=()
for p in ${phantoms//,/ }; do phantom_args+=(--phantom "$p"); done
timeout "$seconds" python3 -m rocm_zoo.cli -v bench-batch --bundle-dir "/tmp/zoo/model/$bundle" "${phantom_args[@]}" \
  --repeats "$repeats" --out "/tmp/batch-$bundle" 2>&1 | grep -v -i "warn\|nvimg" || echo "bench-batch $bundle: exit $?"
mkdir -p "$OUT/batch-$bundle"
cp /tmp/batch-"$bundle"/batch.* "$OUT/batch-$bundle/" 2>/dev/null || echo "bench-batch $bundle: no record"

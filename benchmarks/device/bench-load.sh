#!/usr/bin/env bash
# The load benchmark on the GPU machine (`rocm-zoo bench-load`, issue 14): the server started by bench-load with the
# full-size sample bundles on the GPU, one user of each class alone first (the baseline), then the mixed load:
# 2 DeepEdit clinicians (3D Slicer clicks) and 1 VISTA3D clinician (OHIF point prompts), 1 s think time, each on a
# spleen_10-shaped study of its own; 1 client asking wholeBody_ct back to back on a fourth; a wholeBody_ct batch over
# the datastore (24 spleen_10-shaped studies); the monitor polling /info/ and /health/*.
# Needs the server's wheels in /tmp/wheels, carried as for benchmarks/device/server-bench.sh, and Locust's in
# /tmp/wheels-locust: carry .whl-srv-7 (benchmarks/device/server-wheels) with
#   mkdir -p /tmp/wheels-locust && cp .whl-srv-7/* /tmp/wheels-locust/
#   benchmarks/device/bench-load.sh [SECONDS] [BASELINE_SECONDS] [more bench-load options]   default 60 and 20
# Results (in $LOAD_OUT, default $OUT/load): load.json, load.md, load.png, samples.jsonl, server.log, the Locust logs.
set -euo pipefail
seconds=${1:-60} baseline=${2:-20}
shift 2 || shift $#
source benchmarks/device/server-site.sh
if ! python3 -c "import locust" 2> /dev/null; then
  [ -d /tmp/site-locust/locust ] || python3 -m pip install -q --no-index --no-deps --no-compile \
    --target /tmp/site-locust /tmp/wheels-locust/*.whl
  export PYTHONPATH=$PYTHONPATH:/tmp/site-locust  # after /tmp/site: the server's own versions win
fi
zoo=/tmp/zoo
for bundle in spleen_deepedit_annotation vista3d wholeBody_ct_segmentation; do
  [ -d "$zoo/model/$bundle" ] || python3 -m rocm_zoo.cli sample --size full --bundle "$bundle" \
    --model-dir "$zoo/model" --studies "$zoo/studies" --truth "$zoo/truth" 2>&1 | tail -1
done
# 24 studies of the spleen_10 shape: the clinicians' three, the automatic client's one, and the batch's datastore.
mkdir -p /tmp/load-data/studies /tmp/load-data/truth
for i in $(seq -w 1 24); do
  cp -n "$zoo/studies/phantom_spleen10.nii.gz" "/tmp/load-data/studies/spleen10_$i.nii.gz"
  cp -n "$zoo/truth/phantom_spleen10.nii.gz" "/tmp/load-data/truth/spleen10_$i.nii.gz"
done
python3 -m rocm_zoo.cli -v bench-load --app "$zoo" --studies /tmp/load-data/studies --truth /tmp/load-data/truth \
  --device cuda --deepedit 2 --vista3d 1 --image spleen10_01 --image spleen10_02 --image spleen10_03 \
  --automatic 1 --automatic-model wholeBody_ct --automatic-image spleen10_04 --batch wholeBody_ct \
  --think-time 1 --duration "$seconds" --baseline --baseline-duration "$baseline" --out "${LOAD_OUT:-$OUT/load}" "$@" \
  2>&1 | grep -v -i "warn\|nvimg" || echo "bench-load: exit $?"

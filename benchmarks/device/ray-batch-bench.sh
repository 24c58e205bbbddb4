#!/usr/bin/env bash
# Ray batch scaling on a GPU machine with several GPUs (nvidia-h200-x2 or larger): wholeBody_ct over the same
# spleen_10-shaped studies with 1 worker (one GPU) and with N workers (one per GPU), `rocm-zoo batch`; studies per
# minute of each (counted from the first study given out, after every worker is warm) and the scaling efficiency
# (N-GPU rate) / (N x 1-GPU rate). Needs /tmp/wheels as for benchmarks/device/batch-bench.sh plus .whl-srv-5 and
# .whl-srv-6 (Ray, benchmarks/device/server-wheels), one call per folder while the machine stays warm.
#   benchmarks/device/ray-batch-bench.sh [STUDIES] [SECONDS]   default 24 studies, 540 s
# Results: $OUT/ray/workers-1.json, workers-N.json (per-study reports) and scaling.json.
set -euo pipefail
studies=${1:-24} seconds=${2:-540}
source benchmarks/device/server-site.sh
if [ ! -d /tmp/site/ray ]; then
  ray_wheel=$(ls /tmp/wheels/ray-*.whl.part-00); ray_wheel=${ray_wheel%.part-00}
  cat "$ray_wheel".part-* > "/tmp/$(basename "$ray_wheel")"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "/tmp/$(basename "$ray_wheel")"
fi
export PYTHONPATH=$PWD/lib:/tmp/site PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH
bundle=wholeBody_ct_segmentation
[ -d "/tmp/zoo/model/$bundle" ] || python3 -m rocm_zoo.cli sample --size full --bundle "$bundle" \
  --model-dir /tmp/zoo/model --studies /tmp/zoo/studies --truth /tmp/zoo/truth 2>&1 | tail -1
mkdir -p /tmp/ray-studies "$OUT/ray"
for i in $(seq -w 1 "$studies"); do
  cp -n /tmp/zoo/studies/phantom_spleen10.nii.gz "/tmp/ray-studies/spleen10_$i.nii.gz"
done
gpus=$(nvidia-smi -L | wc -l)
for workers in 1 "$gpus"; do
  # The first pass also fills the compile cache (model dir/.cache/inductor) that the later workers start from.
  timeout "$seconds" python3 -m rocm_zoo.cli -v batch --model wholeBody_ct --model-dir /tmp/zoo/model \
    --studies /tmp/ray-studies --images all --workers "$workers" --tag "gpus-$workers" \
    --report "$OUT/ray/workers-$workers.json" 2>&1 | grep -v -i "warn\|nvimg" | tail -8 || echo "batch, $workers workers: exit $?"
done
python3 - "$gpus" <<'PY'
import json, os, sys
n = int(sys.argv[1])
out = os.path.join(os.environ["OUT"], "ray")
one = json.load(open(f"{out}/workers-1.json"))["studies_per_min"]
many = json.load(open(f"{out}/workers-{n}.json"))["studies_per_min"]
scaling = {"gpus": n, "studies_per_min_1": one, f"studies_per_min_{n}": many, "efficiency": round(many / (n * one), 3)}
json.dump(scaling, open(f"{out}/scaling.json", "w"), indent=2)
print(scaling)
PY

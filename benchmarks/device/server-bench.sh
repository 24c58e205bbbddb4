#!/usr/bin/env bash
# The MONAI Label server on the GPU machine, timed through its REST API. Wheels travel in four calls, each carrying
# one folder of them while the machine stays warm:  mkdir -p /tmp/wheels && cp .whl-srv-N/* /tmp/wheels/
# (folders made by benchmarks/device/server-wheels, each small enough to travel with the working tree), then this
# script, carrying the last folder. Writes $OUT/rest_click.json and $OUT/server.log.
set -euo pipefail
source benchmarks/device/server-site.sh
python3 -m rocm_zoo.cli sample --size full 2>&1 | tail -1
python3 -m monailabel.main start_server --app apps/rocm_zoo --studies sample-data/studies --conf models all \
  --host 127.0.0.1 --port 8000 > "$OUT/server.log" 2>&1 &
for i in $(seq 1 240); do curl -sf 127.0.0.1:8000/health/ready > /dev/null && break; sleep 1; done
curl -s 127.0.0.1:8000/info/ | python3 -c "import json,sys; m=json.load(sys.stdin)['models']['spleen_deepedit']; print({k: m.get(k) for k in ('backend','device','dtype','compiled','warm','warmup_seconds')})"
python3 benchmarks/bench_rest_click.py http://127.0.0.1:8000 phantom_spleen10 sample-data/truth/phantom_spleen10.nii.gz \
  --out "$OUT/rest_click.json"

#!/usr/bin/env bash
# VISTA3D click-to-mask through the REST API on the GPU machine (benchmarks/bench_rest_click_vista3d.py against a fresh
# server with the full-size sample bundle and the spleen_10-shaped phantom). Needs the server's wheels in /tmp/wheels,
# carried as for benchmarks/device/server-bench.sh, or /tmp/site already installed by benchmarks/device/batch-bench.sh.
# Writes $OUT/rest_click_vista3d.json and $OUT/server-vista3d.log.
set -euo pipefail
source benchmarks/device/server-site.sh
[ -f /tmp/zoo/studies/phantom_spleen10.nii.gz ] && [ -d apps/rocm_zoo/model/vista3d ] || \
  python3 -m rocm_zoo.cli sample --size full --bundle vista3d --studies /tmp/zoo/studies --truth /tmp/zoo/truth 2>&1 | tail -1
python3 -m monailabel.main start_server --app apps/rocm_zoo --studies /tmp/zoo/studies \
  --conf models vista3d --host 127.0.0.1 --port 8000 > "$OUT/server-vista3d.log" 2>&1 &
server=$!
for i in $(seq 1 420); do
  curl -sf 127.0.0.1:8000/health/ready > /dev/null && break
  kill -0 $server 2> /dev/null || { echo "server exited:"; tail -5 "$OUT/server-vista3d.log"; exit 1; }
  sleep 1
done
echo "server up after ${i} s"
python3 benchmarks/bench_rest_click_vista3d.py http://127.0.0.1:8000 phantom_spleen10 /tmp/zoo/truth/phantom_spleen10.nii.gz \
  --out "$OUT/rest_click_vista3d.json"

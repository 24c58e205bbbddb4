#!/usr/bin/env bash
# Why a VISTA3D click slows down under the mixed load, on the GPU machine: benchmarks/probe_vista3d_beside.py (the
# app in one process with full-size vista3d and wholeBody_ct samples; the click alone, beside wholeBody_ct requests,
# beside a Python-only thread, under several switch intervals). Needs the server's wheels in /tmp/wheels, as for
# benchmarks/device-server-bench.sh.
#   benchmarks/device-vista3d-beside.sh [--seconds 15] [--intervals-ms 5,1,0.25]
# Writes $OUT/beside.json.
set -euo pipefail
source benchmarks/device-server-site.sh
for bundle in vista3d wholeBody_ct_segmentation; do
  [ -d "apps/rocm_zoo/model/$bundle" ] || python3 -m rocm_zoo.cli sample --size full --bundle "$bundle" \
    --studies /tmp/zoo/studies --truth /tmp/zoo/truth 2>&1 | tail -1
done
cp -n /tmp/zoo/studies/phantom_spleen10.nii.gz /tmp/zoo/studies/spleen10_auto.nii.gz
python3 benchmarks/probe_vista3d_beside.py /tmp/zoo/studies /tmp/zoo/truth/phantom_spleen10.nii.gz "$OUT/beside.json" \
  "$@" 2>&1 | grep -v -i "^\[\|warn\|nvimg" | tail -30

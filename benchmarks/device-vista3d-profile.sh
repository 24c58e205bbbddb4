#!/usr/bin/env bash
# Where a repeated VISTA3D click spends its time on the GPU machine: benchmarks/profile_vista3d_click.py (the app in one
# process; the click path before pointer jumping and window outputs kept, then each part added; then a torch.profiler
# run) on the full-size sample and the spleen_10-shaped phantom. Needs the server's wheels in /tmp/wheels, as for
# benchmarks/device-vista3d-click-bench.sh.
# Writes $OUT/profile/profile_click.json, profile_ohif4.txt, profile_slicer.txt, trace_ohif4.json.gz.
set -euo pipefail
source benchmarks/device-server-site.sh
[ -f /tmp/zoo/studies/phantom_spleen10.nii.gz ] && [ -d apps/rocm_zoo/model/vista3d ] || \
  python3 -m rocm_zoo.cli sample --size full --bundle vista3d --studies /tmp/zoo/studies --truth /tmp/zoo/truth 2>&1 | tail -1
python3 benchmarks/profile_vista3d_click.py /tmp/zoo/studies phantom_spleen10 /tmp/zoo/truth/phantom_spleen10.nii.gz \
  "$OUT/profile" "$@" 2>&1 | grep -v "^\[" | tail -30

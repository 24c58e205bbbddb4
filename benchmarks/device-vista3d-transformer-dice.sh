#!/usr/bin/env bash
# Whether the compiled point transformer moves a VISTA3D click's mask beyond bf16 rounding, on the GPU machine:
# benchmarks/probe_vista3d_transformer_dice.py with the full-size vista3d sample. Needs the server's wheels in
# /tmp/wheels, as for benchmarks/device-server-bench.sh. Writes $OUT/transformer_dice.json.
set -euo pipefail
source benchmarks/device-server-site.sh
[ -d apps/rocm_zoo/model/vista3d ] || python3 -m rocm_zoo.cli sample --size full --bundle vista3d \
  --studies /tmp/zoo/studies --truth /tmp/zoo/truth 2>&1 | tail -1
python3 benchmarks/probe_vista3d_transformer_dice.py /tmp/zoo/studies /tmp/zoo/truth/phantom_spleen10.nii.gz \
  "$OUT/transformer_dice.json" 2>&1 | grep -v -i "^\[\|warn\|nvimg" | tail -20

#!/usr/bin/env bash
# GPU run of issue 32's second lever: Inductor's compile mode. Per bundle, in one process on one card: fp32 eager (the
# baseline), the overlay as shipped (torch.compile's default mode), the overlay with `max-autotune-no-cudagraphs`
# (Triton/cuDNN/cuBLAS kernels chosen by timing, no CUDA graphs) and with `max-autotune` (the same plus CUDA graphs).
# Each variant's first warm-up includes its compile: bench.json's warm-up times say what the mode costs at start.
# Full-size samples, untrained (seeded) weights, the spleen_10-shaped phantom through each bundle's own transforms;
# Dice against the fp32 baseline. Carry .whl-engine (monai, nibabel, pytorch-ignite, einops wheels for Python 3.12).
# Usage: bash benchmarks/device/compile-mode.sh [BUNDLE ...]   (default: spleen_deepedit_annotation
#        wholeBody_ct_segmentation); RUNS / WARMUP override 20 / 5, MODES the compile modes tried (default
#        "max-autotune-no-cudagraphs max-autotune"). bench.json and bench.md per bundle in $OUT.
set -euo pipefail
source benchmarks/device/engine-setup.sh
RUNS=${RUNS:-20}
WARMUP=${WARMUP:-5}
MODES=${MODES:-max-autotune-no-cudagraphs max-autotune}
variants=()
for mode in $MODES; do
  variants+=(--variant "$mode={\"rocm_overlay#compile_mode\": \"$mode\"}")
done
bundles=("$@")
[ ${#bundles[@]} -gt 0 ] || bundles=(spleen_deepedit_annotation wholeBody_ct_segmentation)
python3 -c 'import torch; print("torch", torch.__version__, "cuDNN", torch.backends.cudnn.version(), torch.cuda.get_device_name())' \
  | tee -a "$OUT/log.txt"
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor  # one cache for the run: each mode's graphs are its own entries
for b in "${bundles[@]}"; do
  start=$(date +%s)
  sample_full "$b"
  python3 -m rocm_zoo.cli -v bench --bundle-dir "/tmp/zoo/model/$b" --out /tmp/bench-out --runs "$RUNS" \
    --warmup "$WARMUP" "${variants[@]}" 2>&1 | quiet | tee -a "$OUT/log.txt"
  cp "/tmp/bench-out/$b/bench.json" "$OUT/$b.json"
  cp "/tmp/bench-out/$b/bench.md" "$OUT/$b.md"
  echo "$b: $(( $(date +%s) - start )) s" | tee -a "$OUT/log.txt"
done

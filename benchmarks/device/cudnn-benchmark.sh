#!/usr/bin/env bash
# GPU run of issue 32's first lever: cuDNN's algorithm search (`torch.backends.cudnn.benchmark`), off in every record
# so far. Per bundle, in one process on one card: fp32 eager (the baseline), fp32 eager with the search, the overlay
# as shipped, the overlay with the search (`rocm_overlay#cudnn_benchmark`). Full-size samples, untrained (seeded)
# weights, the spleen_10-shaped phantom through each bundle's own transforms; Dice against the fp32 baseline.
# Carry .whl-engine (monai, nibabel, pytorch-ignite, einops wheels for Python 3.12).
# Usage: bash benchmarks/device/cudnn-benchmark.sh [BUNDLE ...]   (default: spleen_deepedit_annotation
#        wholeBody_ct_segmentation); RUNS / WARMUP override 20 / 5. bench.json and bench.md per bundle in $OUT.
set -euo pipefail
source benchmarks/device/engine-setup.sh
RUNS=${RUNS:-20}
WARMUP=${WARMUP:-5}
bundles=("$@")
[ ${#bundles[@]} -gt 0 ] || bundles=(spleen_deepedit_annotation wholeBody_ct_segmentation)
python3 -c 'import torch; print("torch", torch.__version__, "cuDNN", torch.backends.cudnn.version(), torch.cuda.get_device_name())'
for b in "${bundles[@]}"; do
  start=$(date +%s)
  sample_full "$b"
  python3 -m rocm_zoo.cli -v bench --bundle-dir "/tmp/zoo/model/$b" --out /tmp/bench-out --runs "$RUNS" \
    --warmup "$WARMUP" --variant 'fp32 eager + cudnn benchmark={"rocm_overlay": {"cudnn_benchmark": true}}' \
    --variant 'cudnn benchmark={"rocm_overlay#cudnn_benchmark": true}' 2>&1 | quiet | tee -a "$OUT/log.txt"
  cp "/tmp/bench-out/$b/bench.json" "$OUT/$b.json"
  cp "/tmp/bench-out/$b/bench.md" "$OUT/$b.md"
  echo "$b: $(( $(date +%s) - start )) s" | tee -a "$OUT/log.txt"
done

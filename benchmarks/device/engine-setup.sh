# Source this on the GPU machine (device tool) before engine-only runs: installs the carried wheels (.whl-engine,
# Python 3.12: monai, nibabel, pytorch-ignite) into /tmp/site and puts rocm_zoo and them on the path. Then e.g.
#   sample_full wholeBody_ct_segmentation && bench wholeBody_ct_segmentation --sw-batch-size 4
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-engine/*.whl
export PYTHONPATH=$PWD/lib:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
python3 -m rocm_zoo.cli env

quiet() { grep -v -i "warn\|nvimg"; }

# sample_full BUNDLE [sample args]: the full-size sample bundle in /tmp/zoo/model
sample_full() {
  local bundle=$1; shift
  python3 -m rocm_zoo.cli sample --size full --bundle "$bundle" --no-spleen10 --model-dir /tmp/zoo/model \
    --studies /tmp/zoo/studies --truth /tmp/zoo/truth "$@" 2>&1 | quiet | tail -3
}

# bench BUNDLE [bench args]: results in $OUT/BUNDLE/
bench() {
  local bundle=$1; shift
  python3 -m rocm_zoo.cli -v bench --bundle-dir "/tmp/zoo/model/$bundle" --out "$OUT" "$@" 2>&1 | quiet
}

# warmup BUNDLE SHAPE [bench-warmup args]: cold start vs restarts from the compile cache, results in $OUT/
warmup() {
  local bundle=$1 shape=$2; shift 2
  python3 -m rocm_zoo.cli bench-warmup --bundle-dir "/tmp/zoo/model/$bundle" --shape "$shape" --out "$OUT" "$@" 2>&1 \
    | quiet
}

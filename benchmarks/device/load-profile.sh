#!/usr/bin/env bash
# Where the shared server's time goes under issue 14's mixed load, on the GPU machine: benchmarks/device/bench-load.sh
# (baseline, then the mix) while py-spy samples the server during the mixed phase, first over every thread, then over
# the thread holding the GIL only (what the clicks' host work waits for). Needs what device/bench-load.sh needs, plus
# py-spy's wheel in /tmp/wheels-locust (carried with Locust's).
#   [NO_PYSPY=1] benchmarks/device/load-profile.sh NAME [SECONDS] [BASELINE_SECONDS] [more bench-load options]
# Results: $OUT/NAME.tgz (NAME/: what device/bench-load.sh writes, bench.log, pyspy-all.txt and pyspy-gil.txt, the
# collapsed stacks) and $OUT/NAME.md, the report.
set -euo pipefail
name=$1 seconds=${2:-60} baseline=${3:-20}
shift 3 || shift $#
source benchmarks/device/server-site.sh
[ -x /tmp/site-pyspy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --no-compile \
  --target /tmp/site-pyspy /tmp/wheels-locust/py_spy-*.whl || true
export LOAD_OUT=/tmp/runs/$name
rm -rf "$LOAD_OUT" && mkdir -p "$LOAD_OUT"
spy() {  # once the mix starts: sample the server for the mix's length, every thread, then the GIL holder only
  for _ in $(seq 1 900); do grep -q "phase 'mixed'" "$LOAD_OUT/bench.log" 2> /dev/null && break; sleep 1; done
  local pid  # (the machine has no pgrep)
  pid=$(python3 - << 'PY'
import os
for p in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
    try:
        cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    if int(p) != os.getpid() and b"monailabel.main" in cmd and b"start_server" in cmd:
        print(p)
        break
PY
)
  [ -n "$pid" ] || { echo "no server process found" > "$LOAD_OUT/pyspy.log"; return 0; }
  local half=$(( (seconds - 6) / 2 ))
  sleep 3
  /tmp/site-pyspy/bin/py-spy record --pid "$pid" --duration "$half" --rate 200 --format raw --nonblocking --threads \
    -o "$LOAD_OUT/pyspy-all.txt" > "$LOAD_OUT/pyspy.log" 2>&1 || true
  /tmp/site-pyspy/bin/py-spy record --pid "$pid" --duration "$half" --rate 200 --format raw --nonblocking --gil \
    -o "$LOAD_OUT/pyspy-gil.txt" >> "$LOAD_OUT/pyspy.log" 2>&1 || true
}
if [ -x /tmp/site-pyspy/bin/py-spy ] && [ -z "${NO_PYSPY:-}" ]; then spy & fi
bash benchmarks/device/bench-load.sh "$seconds" "$baseline" "$@" 2>&1 | tee "$LOAD_OUT/bench.log"
wait
cp "$LOAD_OUT/load.md" "$OUT/$name.md" 2> /dev/null || true
tar czf "$OUT/$name.tgz" -C /tmp/runs "$name"

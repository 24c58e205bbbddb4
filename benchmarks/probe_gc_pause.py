"""The garbage collector's full pause in a warm rocm_zoo app: the app with every model built and warmed in this process,
then gc.collect() timed three times, gc.freeze(), and timed again.

usage: python benchmarks/probe_gc_pause.py STUDIES [SECONDS_TO_WAIT_FOR_THE_BACKGROUND_WARM_UP]
"""
import gc
import sys
import time
from pathlib import Path
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "apps" / "rocm_zoo"))
from main import MyApp
t = time.perf_counter()
app = MyApp(str(REPO / "apps" / "rocm_zoo"), sys.argv[1], {"models": "all", "gc_freeze": "false"})  # the probe freezes itself, after timing
app.on_init_complete()
print("ready", round(time.perf_counter() - t, 1), flush=True)
# wait for background warm-up
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
def timed(gen):
    t = time.perf_counter(); n = gc.collect(gen); return round((time.perf_counter() - t) * 1000, 1), n
print("objects", len(gc.get_objects()), "counts", gc.get_count(), "threshold", gc.get_threshold())
for i in range(3):
    print("gen2", timed(2), "gen1", timed(1), "gen0", timed(0))
gc.freeze()
print("frozen", gc.get_freeze_count())
for i in range(3):
    print("after freeze gen2", timed(2))

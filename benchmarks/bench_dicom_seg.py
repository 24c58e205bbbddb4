"""DICOM SEG encoding time for a whole-body-like label on the spleen_10-shaped phantom's CT series (CPU).

104 label values in 8x8x5-voxel blocks inside the body, as fragmented as an untrained wholeBody_ct output: the worst
case for a SEG (one frame per segment per slice it touches). Encodes three times with rocm_zoo.dicomweb.dicom_seg.encode,
prints the p50, the frame count, whether the SEG read back gives the label exactly, and the process's peak RSS.

    .venv/bin/python benchmarks/bench_dicom_seg.py
"""

from __future__ import annotations

import io
import resource
import time

import numpy as np
import pydicom

from rocm_zoo.bench.stats import percentile
from rocm_zoo.dicomweb import dicom_seg

from rocm_zoo.samples import phantom
from rocm_zoo.samples.dicom_series import slice_datasets


def main() -> None:
    ph = phantom.make_phantom(phantom.SPLEEN10)
    source = slice_datasets(ph)
    shape = ph.truth.shape
    blocks = np.random.default_rng(0).integers(0, 105, size=(shape[0] // 8 + 1, shape[1] // 8 + 1, shape[2] // 5 + 1))
    label = blocks.repeat(8, 0).repeat(8, 1).repeat(5, 2)[:shape[0], :shape[1], :shape[2]].astype(np.uint8)
    label[ph.image < -500] = 0
    segments = {v: dicom_seg.Segment(v, f"organ {v}", (200, 100, 50)) for v in range(1, 105)}
    times = []
    for _ in range(3):
        start = time.perf_counter()
        seg = dicom_seg.encode(label, ph.affine, source, segments, "bench")
        times.append(time.perf_counter() - start)
    buf = io.BytesIO()
    seg.save_as(buf)
    buf.seek(0)
    back = dicom_seg.decode(pydicom.dcmread(buf), source)
    print(f"encode p50 {percentile(times, 50):.2f} s (runs {', '.join(f'{t:.2f}' for t in times)}), "
          f"{len(seg.SegmentSequence)} segments, {seg.NumberOfFrames} frames, "
          f"read back equal: {bool(np.array_equal(back, label))}, "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")


if __name__ == "__main__":
    main()

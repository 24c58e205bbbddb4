"""Does compiling VISTA3D's point transformer change a click's mask beyond what bf16 rounding explains?

The rocm_zoo app built in this process (vista3d only, warm, `app.infer` as a clinician's click), then each request
three times with the point head's transformer
  eager       bf16 autocast, not compiled (the overlay before the transformer was compiled)
  compiled    bf16 autocast, torch.compile (the overlay now)
  eager_fp32  not compiled, autocast off inside the transformer: what bf16 rounding alone moves
and, per request, the masks compared pairwise: voxels that differ, and Dice of the prompted class (or of the
foreground, for clicks without a class). Compiling changes bf16 rounding (fused operations round once where eager
rounds each); the question is whether compiled-vs-eager stays within eager-vs-fp32.

  python benchmarks/probe_vista3d_transformer_dice.py STUDIES TRUTH_NIFTI OUT_JSON
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import nibabel as nib
import numpy as np
import torch

from profile_vista3d_click import SPLEEN_TRUTH, VISTA_SPLEEN, one, point_transformer, warm_app
from rocm_zoo.bench.load import organ_clicks
from rocm_zoo.bench.network import versions
from rocm_zoo.engine.masks import dice

IMAGE = "phantom_spleen10"
PAIRS = (("compiled", "eager"), ("eager", "eager_fp32"), ("compiled", "eager_fp32"))


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Dice of two masks, 1 when both are empty (here: the same answer, not a miss)."""
    return 1.0 if not (a.any() or b.any()) else round(dice(a, b), 5)


def fp32_forward(transformer: torch.nn.Module):
    forward = type(transformer).forward

    def run(*args, **kwargs):
        as_fp32 = lambda v: v.float() if torch.is_tensor(v) and v.is_floating_point() else v  # noqa: E731
        with torch.autocast(args[0].device.type if args and torch.is_tensor(args[0]) else "cuda", enabled=False):
            return forward(transformer, *[as_fp32(a) for a in args], **{k: as_fp32(v) for k, v in kwargs.items()})

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("studies"), p.add_argument("truth"), p.add_argument("out", type=Path)
    a = p.parse_args()
    points = organ_clicks(np.asarray(nib.load(a.truth).dataobj), SPLEEN_TRUTH, count=4)
    common = {"model": "vista3d", "image": IMAGE, "result_extension": ".nrrd", "result_dtype": "uint8",
              "client_id": "clinician"}
    requests = {
        "1 point, class spleen": {"points": points[:1], "point_labels": [1], "label_prompt": [VISTA_SPLEEN]},
        "2 points, class spleen": {"points": points[:2], "point_labels": [1, 1], "label_prompt": [VISTA_SPLEEN]},
        "4 points, class spleen (bench-load's)": {"points": points, "point_labels": [1] * 4,
                                                  "label_prompt": [VISTA_SPLEEN]},
        "3 points, one background, class spleen": {"points": points[:3], "point_labels": [1, 0, 1],
                                                   "label_prompt": [VISTA_SPLEEN]},
        "1 point, no class": {"points": points[:1], "point_labels": [1]},
        "4 points, no class": {"points": points, "point_labels": [1] * 4},
    }

    app = warm_app(a.studies, "vista3d")
    transformer = point_transformer(app)
    compiled_call = transformer._compiled_call_impl
    device = "cuda" if torch.cuda.is_available() else "cpu"
    record: dict = {"versions": versions(device), "overlay_compiles_transformer": compiled_call is not None,
                    "image": IMAGE, "requests": {}}
    for name, params in requests.items():
        request = {**common, **params}
        masks: dict[str, np.ndarray] = {}
        for variant in ("compiled", "eager", "eager_fp32"):
            transformer._compiled_call_impl = compiled_call if variant == "compiled" else None
            if variant == "eager_fp32":
                transformer.forward = fp32_forward(transformer)
            answers: list = []
            one(app, request)  # the image's windows cached, the variant's graph warm
            one(app, request, answers)
            masks[variant] = answers[0]
            if variant == "eager_fp32":
                del transformer.forward
        transformer._compiled_call_impl = compiled_call
        label = params.get("label_prompt", [None])[0]
        of = (lambda m: m == label) if label is not None else (lambda m: m > 0)
        entry = {"voxels_in_mask": {v: int(of(m).sum()) for v, m in masks.items()}}
        for x, y in PAIRS:
            entry[f"{x} vs {y}"] = {"voxels_unlike": int((masks[x] != masks[y]).sum()),
                                    "dice": agreement(of(masks[x]), of(masks[y]))}
        record["requests"][name] = entry
        print(json.dumps({name: entry}), flush=True)
        a.out.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()

"""Which VISTA3D classes a training teaches, as upstream's continual-learning config (`configs/train_continual.json`)
says it: the labels' own values map to VISTA3D's global class ids.

VISTA3D's trainer prompts the network with the label values it finds in a patch as global class ids, and only those in
`label_set`; its validation prompts every class of `label_set` at once and scores channel i against label value i. The
bundle's train.json fine-tunes MSD spleen as classes 0 and 1 (`label_set` null, `output_classes` 2), which would teach
a spleen (global id 3) saved by a viewer nothing. These keys, merged over the train config, make the label values
global ids after the random crop (`Relabeld`, the transform upstream uses for it) and positions in `label_set` for
validation, as train_continual.json does.
"""

from __future__ import annotations

from typing import Any


def class_overrides(mapping: dict[int, int]) -> tuple[tuple[str, Any], ...]:
    """Config keys for labels whose value v (> 0) stands for VISTA3D's global class mapping[v]."""
    if not mapping or any(v <= 0 or g <= 0 for v, g in mapping.items()):
        raise ValueError(f"VISTA3D training needs label value -> global class id pairs, both above 0 (got {mapping})")
    pairs = sorted(mapping.items(), key=lambda pair: pair[1])
    relabel = {"_target_": "monai.apps.vista3d.transforms.Relabeld", "keys": "label", "dtype": "$torch.uint8"}
    return (
        ("label_mappings", {"default": [[v, g] for v, g in pairs]}),
        ("label_set", [0] + [g for _, g in pairs]),
        ("val_label_set", [0] + [v for v, _ in pairs]),
        ("output_classes", len(pairs) + 1),
        # the crop samples around every label value the data holds
        ("train#random_transforms#0#num_classes", max(mapping) + 1),
        ("train#relabel", {**relabel, "label_mappings": "@label_mappings"}),
        ("train#preprocessing#transforms", "$@train#deterministic_transforms + @train#random_transforms"
                                           " + [@train#relabel]"),
        ("valid_remap", {**relabel, "label_mappings": "${'default': [[c, i] for i, c in enumerate(@val_label_set)]}"}),
        ("validate#preprocessing#transforms", "$@train#deterministic_transforms + [@valid_remap]"),
    )

"""Uploads ad-hoc DICOM datasets to the test PACS (a plain module: test files import it, fixtures stay in conftest)."""

from __future__ import annotations

from pathlib import Path

from rocm_zoo.bench import pacs


def upload_datasets(local_pacs, datasets, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i, ds in enumerate(datasets):
        files.append(folder / f"{i:04d}.dcm")
        ds.save_as(files[-1], write_like_original=False)
    pacs.upload(local_pacs.config, files)

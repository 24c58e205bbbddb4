"""rocm_zoo: MONAI Model Zoo bundles made fast by overlays, on ROCm, CUDA and CPU, served by MONAI Label.

Packages, by who needs them (dependencies point one way, down this list):
- `registry`, `errors`: the one table of bundles and tasks; typed errors with their HTTP status. No torch.
- `dicom_volume`: a CT volume as a DICOM series with stable UIDs. numpy and pydicom only.
- `engine`: backend policy, bundle config + overlay, the warm network pool, caches. torch and MONAI only.
- `vista3d`: VISTA3D's prompts, click mapping, predictor, window stitching, connected components.
- `training`: a bundle's own train config run with the overlay at the scheduler's lowest class; checkpoints.
- `server`: the MONAI Label layer (tasks, datastores, routes, log-in). Needs monailabel.
- `dicomweb`: a DICOMweb PACS as the datastore; labels back as DICOM SEG; OHIF's proxy to it, or its reads of the
  local studies folder.
- `scale`: batch segmentation on Ray workers.
- `app`: the composition root: the MONAI Label app, the zoo of tasks, `--conf`, the app folder.
- `samples`, `bench`: sample data and bundles; benchmarks and test tools. Never imported by the server at run time.
- `cli`: `rocm-zoo`, a thin shell over the packages' public functions.
"""

__version__ = "0.1.0"

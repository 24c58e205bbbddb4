"""VISTA3D's request path: prompts, click mapping, the predictor the inferer calls, device window stitching and
connected components. Imports torch and MONAI only."""

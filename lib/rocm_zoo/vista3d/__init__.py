"""VISTA3D's request path: prompts, click mapping, the predictor the inferer calls, device window stitching and
connected components. Imports torch and MONAI only.

`install(network, inferer)` sets up every place where rocm_zoo reroutes MONAI's or the bundle's calls (see
`reroutes`); the VISTA3D task calls it before each run of the inferer.
"""

from rocm_zoo.vista3d.points import image_affines, stored_to_preprocessed
from rocm_zoo.vista3d.predictor import EmbeddingCache, VistaPredictor, embedding_cache
from rocm_zoo.vista3d.prompts import VistaPrompt, from_ohif, from_slicer
from rocm_zoo.vista3d.reroutes import install

__all__ = [
    "EmbeddingCache",
    "VistaPredictor",
    "VistaPrompt",
    "embedding_cache",
    "from_ohif",
    "from_slicer",
    "image_affines",
    "install",
    "stored_to_preprocessed",
]

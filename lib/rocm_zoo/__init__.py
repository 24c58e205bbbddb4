"""rocm_zoo: MONAI Model Zoo bundles made fast by overlays, on ROCm, CUDA and CPU.

The engine (backend, overlay, pool, guidance, samples, bench) imports torch and MONAI only; `rocm_zoo.tasks` holds
the MONAI Label tasks and is the only part that needs monailabel.
"""

__version__ = "0.1.0"

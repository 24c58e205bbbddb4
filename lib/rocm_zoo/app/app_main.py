"""The MONAI Label app folder's main.py: MONAI Label loads `<app>/main.py` and takes the class in it whose direct base
is MONAILabelApp. The app itself is rocm_zoo.app.app; this file only names it. apps/rocm_zoo/main.py of a checkout
is this file (a symlink); `rocm-zoo serve` copies it into the app folder it uses.

Start:  monailabel start_server --app apps/rocm_zoo --studies <dir> --conf models all
"""

from rocm_zoo.app.app import MyApp  # noqa: F401

"""The MONAI Label app folder `rocm-zoo serve` starts: MONAI Label loads `<app>/main.py` from it and writes its logs
under it, and the bundles live in `<app>/model`. So the folder is the user's (default apps/rocm_zoo in the current
folder, as in a checkout), never inside the installed package; only its main.py comes from the package."""

from __future__ import annotations

import importlib.resources
import shutil
from pathlib import Path

MAIN = importlib.resources.files("rocm_zoo.app") / "app_main.py"


# What the main.py copied by earlier versions imports: the app has moved, so such a copy is replaced.
EARLIER_IMPORT = "from rocm_zoo.server.app import MyApp"


def make_app_folder(app_dir: Path) -> Path:
    """`app_dir` with a main.py; one already there (a checkout's symlink, or the user's own) is kept, unless it is a
    copy an earlier version made, which names the app where it no longer is."""
    main = Path(app_dir) / "main.py"
    if not main.exists() or (not main.is_symlink() and EARLIER_IMPORT in main.read_text(errors="replace")):
        main.parent.mkdir(parents=True, exist_ok=True)
        with MAIN.open("rb") as src, open(main, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return Path(app_dir)

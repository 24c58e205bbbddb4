"""Dependencies point one way (lib/rocm_zoo/__init__.py): the engine knows nothing of MONAI Label, the server never
imports the samples or the benchmarks, and the registry needs neither torch nor monailabel. Read from the source, so
a lazy import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lib" / "rocm_zoo"

# package -> what it must never import (top-level names after `rocm_zoo.`, or other distributions). No exceptions:
# the composition root (`app`) sits above the server, the PACS datastore and the Ray batch it composes.
FORBIDDEN = {
    "registry.py": {"torch", "monai", "monailabel", "engine", "vista3d", "server", "dicomweb", "scale", "app", "samples",
                    "bench"},
    "errors.py": {"torch", "monai", "monailabel", "engine", "vista3d", "server", "dicomweb", "scale", "app", "samples",
                  "bench"},
    "dicom_volume.py": {"torch", "monai", "monailabel", "engine", "vista3d", "server", "dicomweb", "scale", "app",
                        "samples", "bench"},
    "engine": {"monailabel", "vista3d", "server", "dicomweb", "scale", "app", "samples", "bench"},
    "vista3d": {"monailabel", "server", "dicomweb", "scale", "app", "samples", "bench"},
    "training": {"monailabel", "vista3d", "server", "dicomweb", "scale", "app", "samples", "bench"},
    "server": {"dicomweb", "scale", "app", "samples", "bench"},
    "dicomweb": {"scale", "app", "samples", "bench"},
    "scale": {"app", "samples", "bench"},
    "app": {"samples", "bench"},
    "samples": {"monailabel", "server", "dicomweb", "scale", "app", "bench", "vista3d"},
}


def imported_names(path: Path) -> set[str]:
    """What a module imports: `rocm_zoo.X...` as X, anything else as its top-level distribution name."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        modules = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "rocm_zoo"]
        for m in modules:
            parts = m.split(".")
            names.add(parts[1] if parts[0] == "rocm_zoo" and len(parts) > 1 else parts[0])
    return names


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_dependencies_point_one_way(part):
    target = PACKAGE / part
    files = [target] if target.suffix == ".py" else sorted(target.rglob("*.py"))
    assert files, f"{target} is missing"
    wrong = {f"{f.relative_to(PACKAGE)} imports {n}" for f in files
             for n in imported_names(f) & FORBIDDEN[part]}
    assert not wrong, sorted(wrong)


def test_the_check_sees_a_forbidden_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from rocm_zoo.samples import phantom\n    import monailabel.config\n")
    assert {"samples", "monailabel"} <= imported_names(module)

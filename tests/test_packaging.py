"""The package works as installed, not only from a checkout: a wheel in a fresh virtual environment writes the samples
into the current folder and serves a DeepEdit click from there, writing nothing inside the environment; the base
install (no extras) runs `rocm-zoo sample`, and its imports are covered by the base dependencies.

No download: the fresh environment gets the shared environment's packages through a `.pth` line put behind its own
site-packages (so its rocm_zoo is the wheel's, and the shared environment's editable rocm_zoo never loads)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import requests

from rocm_zoo.engine.masks import central_voxel, dice
from zoo_test_support import REPO, free_port

SERVER_START_TIMEOUT_S = 900
SAMPLE_ARGS = ["sample", "--no-spleen10", "--bundle", "spleen_deepedit_annotation"]
# The tiny sample network's one-click Dice is 0.85-0.9 (tests/server/test_server_deepedit.py); a wheel serves the same.
MIN_DICE_ONE_CLICK = 0.8


def test_the_checkout_app_main_is_the_package_one():
    """One copy of main.py: the checkout's app folder links to the file `rocm-zoo serve` copies into a new one."""
    from rocm_zoo.app.app_folder import MAIN

    main = REPO / "apps" / "rocm_zoo" / "main.py"
    assert main.is_symlink()
    assert main.resolve() == Path(str(MAIN)).resolve()


def test_an_app_folder_an_earlier_version_made_gets_the_new_main_and_a_users_own_is_kept(tmp_path):
    """The app moved from rocm_zoo.server to rocm_zoo.app: a main.py copied before names it where it no longer is."""
    from rocm_zoo.app.app_folder import MAIN, make_app_folder

    earlier, own = tmp_path / "earlier", tmp_path / "own"
    for folder, text in ((earlier, "from rocm_zoo.server.app import MyApp  # noqa: F401\n"),
                         (own, "from my_site.app import SiteApp  # noqa: F401\n")):
        folder.mkdir()
        (folder / "main.py").write_text(text)
        make_app_folder(folder)
    assert (earlier / "main.py").read_bytes() == Path(str(MAIN)).read_bytes()
    assert (own / "main.py").read_text() == "from my_site.app import SiteApp  # noqa: F401\n"


def test_default_paths_follow_the_current_folder(tmp_path, monkeypatch):
    from rocm_zoo.samples.write import TRAINED_WEIGHTS, default_paths, installed

    monkeypatch.chdir(tmp_path)
    d = default_paths()
    assert d.studies == tmp_path / "sample-data" / "studies"
    assert d.truth == tmp_path / "sample-data" / "truth"
    assert d.model_dir == tmp_path / "apps" / "rocm_zoo" / "model"
    assert TRAINED_WEIGHTS.is_file()
    # `--train` replaces the packaged weights in a checkout only, never inside an installed environment
    assert not installed(TRAINED_WEIGHTS)
    assert installed(Path(sysconfig.get_paths()["purelib"]) / "rocm_zoo" / "samples" / "weights" / "x.pt")


def _files(folder: Path) -> set[Path]:
    return {p.relative_to(folder) for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def _env_without_checkout(venv: Path) -> dict[str, str]:
    """The fresh environment first on PATH; no PYTHONPATH (it would put the checkout's lib/ before the wheel)."""
    shared_bin = str(Path(sys.executable).parent)
    path = [str(venv / "bin")] + [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != shared_bin]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return dict(env, PATH=os.pathsep.join(path), VIRTUAL_ENV=str(venv), PYTHONUNBUFFERED="1")


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("packaging")
    src = root / "src"  # a copy, so the build's own folders (build/, *.egg-info) stay out of the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "lib", src / "lib", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(root / "dist"), str(src)], check=True)
    (wheel,) = (root / "dist").glob("rocm_zoo-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)  # pip from ensurepip's bundled wheel
    python = venv / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], check=True)
    site_packages = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   check=True, capture_output=True, text=True).stdout.strip()
    # Behind the wheel: torch, monai, monailabel... A `.pth` line adds a folder, not its own `.pth` files, so the
    # shared environment's editable finder for rocm_zoo is never installed.
    (Path(site_packages) / "zz_shared_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = subprocess.run([python, "-c", "import rocm_zoo; print(rocm_zoo.__file__)"], check=True, cwd=root,
                           capture_output=True, text=True, env=_env_without_checkout(venv)).stdout.strip()
    assert Path(where).is_relative_to(venv), f"rocm_zoo imported from {where}, not from the wheel in {venv}"
    return venv


@pytest.mark.slow
def test_wheel_samples_and_serves_a_click_from_an_empty_folder(wheel_venv, tmp_path):
    venv = wheel_venv
    env = _env_without_checkout(venv)
    before = _files(venv)
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run([venv / "bin" / "rocm-zoo", *SAMPLE_ARGS], check=True, cwd=work, env=env)
    bundle = work / "apps" / "rocm_zoo" / "model" / "spleen_deepedit_annotation"
    assert (bundle / "models" / "model.pt").is_file()
    image_id = "phantom_test0"
    assert (work / "sample-data" / "studies" / f"{image_id}.nii.gz").is_file()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([venv / "bin" / "rocm-zoo", "serve", "--models", "spleen_deepedit", "--conf", "device",
                                 "cpu", "--host", "127.0.0.1", "--port", str(port)],
                                cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + SERVER_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode}:\n{log_path.read_text()[-5000:]}")
            try:
                if requests.get(f"{url}/health/ready", timeout=5).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):
                pass
            if time.time() > deadline:
                pytest.fail(f"server not up after {SERVER_START_TIMEOUT_S} s:\n{log_path.read_text()[-5000:]}")
            time.sleep(1)

        import nibabel as nib
        import SimpleITK as sitk

        truth = np.asarray(nib.load(work / "sample-data" / "truth" / f"{image_id}.nii.gz").dataobj) == 1
        click = central_voxel(truth)
        params = {"result_extension": ".nrrd", "result_dtype": "uint8", "client_id": "packaging", "label": "spleen",
                  "spleen": [click], "background": []}
        r = requests.post(f"{url}/infer/spleen_deepedit", params={"image": image_id, "output": "image"},
                          files={"params": (None, json.dumps(params))}, timeout=600)
        assert r.status_code == 200, r.text[:2000]
        with tempfile.NamedTemporaryFile(suffix=".nrrd") as f:
            f.write(r.content)
            f.flush()
            labels = sitk.GetArrayFromImage(sitk.ReadImage(f.name)).transpose(2, 1, 0)
        assert labels.shape == truth.shape
        assert labels[tuple(click)] == 1, "the clicked voxel must be in the mask"
        assert dice(labels == 1, truth) >= MIN_DICE_ONE_CLICK
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    # The app folder, its logs and compile cache are the user's, in the current folder; the environment is untouched.
    assert (work / "apps" / "rocm_zoo" / "main.py").is_file()
    assert (work / "apps" / "rocm_zoo" / "logs").is_dir()
    assert _files(venv) == before, f"written inside the environment: {sorted(map(str, _files(venv) - before))}"


# The child is a base install: every module that only a distribution outside the base dependencies provides (monailabel
# and the server extras first) is unimportable, as it would be there, then it runs `rocm-zoo sample`.
_AS_BASE_INSTALL = """
import json, os, sys
for name in json.loads(os.environ["ROCM_ZOO_TEST_BLOCKED"]):
    sys.modules.setdefault(name, None)  # `import name` raises ImportError; what start-up loaded already stays
from rocm_zoo.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _base_closure() -> set[str]:
    """The base dependencies of pyproject.toml and, as installed here, theirs (no extras), as normalised names."""
    from packaging.requirements import Requirement

    todo = [Requirement(r) for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = _norm(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            todo += [Requirement(r) for r in metadata.requires(req.name) or []]
        except metadata.PackageNotFoundError:
            pass
    return seen


@pytest.mark.slow
def test_base_install_runs_sample_without_monailabel(tmp_path):
    base = _base_closure()
    assert "pyyaml" in base  # the pancreas DiNTS sample bundle writes YAML
    blocked = sorted(module for module, dists in metadata.packages_distributions().items()
                     if module != "rocm_zoo" and not any(_norm(d) in base for d in dists))
    assert "monailabel" in blocked and "pydicom" in blocked
    done = subprocess.run([sys.executable, "-c", _AS_BASE_INSTALL, *SAMPLE_ARGS], cwd=tmp_path, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(REPO / "lib"),
                                              ROCM_ZOO_TEST_BLOCKED=json.dumps(blocked)))
    assert done.returncode == 0, done.stderr[-5000:]
    assert (tmp_path / "apps" / "rocm_zoo" / "model" / "spleen_deepedit_annotation" / "models" / "model.pt").is_file()
    for folder in ("studies", "truth"):
        assert (tmp_path / "sample-data" / folder / "phantom_test0.nii.gz").is_file()

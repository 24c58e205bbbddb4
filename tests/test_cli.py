"""`rocm-zoo` as a user runs it: the console script, in a subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROCM_ZOO = shutil.which("rocm-zoo", path=str(Path(sys.executable).parent))


def run(*args: str) -> subprocess.CompletedProcess:
    if ROCM_ZOO is None:
        pytest.skip("the rocm-zoo console script is not installed in this environment (pip install -e .)")
    return subprocess.run([ROCM_ZOO, *args], capture_output=True, text=True, timeout=600)


def test_help_lists_every_command():
    out = run("--help")
    assert out.returncode == 0
    for command in ("sample", "serve", "env", "bench", "bench-click", "bench-warmup", "bench-train", "models"):
        assert command in out.stdout


def test_env_reports_the_cpu_backend_here():
    out = run("env", "--device", "cpu")
    assert out.returncode == 0
    assert out.stdout.startswith("backend=cpu device=cpu")
    assert "export" not in out.stdout  # ROCm environment defaults are for ROCm only


def test_sample_writes_studies_truth_and_bundle_and_keeps_a_real_bundle(tmp_path):
    dirs = {"--studies": tmp_path / "studies", "--truth": tmp_path / "truth", "--model-dir": tmp_path / "model"}
    args = [a for k, v in dirs.items() for a in (k, str(v))]
    out = run("sample", "--no-spleen10", *args)
    assert out.returncode == 0, out.stderr
    studies = sorted(p.name for p in dirs["--studies"].iterdir())
    assert studies == sorted(p.name for p in dirs["--truth"].iterdir())  # one truth mask per study, kept apart
    assert len(studies) == 3
    bundle = dirs["--model-dir"] / "spleen_deepedit_annotation"
    for rel in ("configs/inference.json", "configs/metadata.json", "models/model.pt", "scripts/transforms.py"):
        assert (bundle / rel).is_file(), rel
    assert "Not a clinical model" in json.loads((bundle / "configs/metadata.json").read_text())["description"]

    # a real bundle (metadata without the sample marker) is never overwritten
    real_meta = {"name": "Spleen DeepEdit annotation", "version": "0.5.0"}
    (bundle / "configs/metadata.json").write_text(json.dumps(real_meta))
    weights = (bundle / "models/model.pt").read_bytes()
    assert run("sample", "--no-spleen10", *args).returncode == 0
    assert json.loads((bundle / "configs/metadata.json").read_text()) == real_meta
    assert (bundle / "models/model.pt").read_bytes() == weights


def test_models_lists_checkpoints_and_rolls_back(tmp_path, capsys):
    import torch
    from torch import nn

    from rocm_zoo.cli import main
    from rocm_zoo.server.audit.trail import AuditTrail, trail_path
    from rocm_zoo.training import CheckpointStore, TrainingDetails

    bundle = tmp_path / "model" / "spleen_deepedit_annotation"
    (bundle / "models").mkdir(parents=True)
    torch.save(nn.Conv3d(1, 2, 1).state_dict(), bundle / "models" / "model.pt")
    model_dir = ["--model-dir", str(tmp_path / "model")]
    assert main(["models", "list", *model_dir]) == 0
    assert "spleen_deepedit_annotation: no checkpoints kept" in capsys.readouterr().out

    store = CheckpointStore(bundle)
    details = TrainingDetails(measured_on="2 validation images", epochs=5, labels=8)
    store.accept(nn.Conv3d(1, 2, 1).state_dict(), 0.812, details)
    store.accept(nn.Conv3d(1, 2, 1).state_dict(), 0.79, details)
    assert main(["models", "list", "spleen_deepedit_annotation", *model_dir]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [r.split()[0] for r in rows[2:5]] == ["shipped", "1", "*"]
    assert "0.812  training" in rows[3] and rows[4].split()[1] == "2"

    assert main(["models", "rollback", "spleen_deepedit_annotation", "1", *model_dir]) == 0
    out = capsys.readouterr().out
    assert "now serving checkpoint 1 (score 0.812)" in out and "picks it up at its next request" in out
    assert store.served().rollback_of == "1"
    rolled = list(AuditTrail(trail_path(tmp_path)).entries(event="weights.rolled_back"))
    assert [e["details"] for e in rolled] == [{"model": "spleen_deepedit_annotation", "checkpoint": "3",
                                               "rollback_of": "1"}]
    assert rolled[0]["actor"]["user"].startswith("os:")

    assert main(["models", "rollback", "spleen_deepedit_annotation", "7", *model_dir]) == 1
    assert "has no checkpoint '7'; kept: shipped, 1, 2, 3" in capsys.readouterr().err
    assert main(["models", "list", "no_such_bundle", *model_dir]) == 2
    assert "no bundle 'no_such_bundle'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # argparse: BUNDLE and ID are required
        main(["models", "rollback", *model_dir])
    assert exited.value.code == 2
    assert main(["models", "list", *model_dir, "spleen_deepedit_annotation"]) == 0  # options before or after

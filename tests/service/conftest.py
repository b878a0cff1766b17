"""Servers for the service tests: real uvicorn processes on 127.0.0.1, each with its own store."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.service.server import Server

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The default server: no API key, fake job functions, generous limits."""
    srv = Server(tmp_path_factory.mktemp("svc")).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def strict_server(tmp_path_factory):
    """A server with an API key, a 64 KiB body limit, 40 stages at most and a queue of 2."""
    srv = Server(
        tmp_path_factory.mktemp("svc-strict"),
        env={
            "MEMPLAN_API_KEY": "s3cret",
            "MEMPLAN_MAX_BODY_BYTES": str(64 << 10),
            "MEMPLAN_MAX_STAGES": "40",
            "MEMPLAN_MAX_QUEUE_DEPTH": "2",
        },
    ).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def make_profile(n: int = 6, *, seed: int = 0) -> dict:
    """A small valid profile of `n` stages with distinct sizes."""
    return {
        "name": f"chain{n}",
        "input_bytes": 1000,
        "fixed_bytes": 10_000,
        "layers": [
            {
                "name": f"block.{i}",
                "forward_s": 1e-3 * (1 + (i + seed) % 3),
                "backward_s": 2e-3 * (1 + (i + seed) % 3),
                "output_bytes": 1000 + 10 * i,
                "saved_bytes": 4000 + 100 * ((i * 7 + seed) % 5),
                "forward_temp_bytes": 50,
                "backward_temp_bytes": 80,
            }
            for i in range(n)
        ],
    }


@pytest.fixture
def profile() -> dict:
    return make_profile()


@pytest.fixture(scope="session")
def gpt24() -> dict:
    return json.loads((ROOT / "examples" / "gpt24.json").read_text())

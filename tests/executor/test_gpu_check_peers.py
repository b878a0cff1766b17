"""scripts/gpu_check.py's peers section as its CPU logic check (`--device cpu --tiny`): a tiny
Hugging Face GPT-2 against the peers' checkpointing, and memplan's installed plans at each peer's
measured peak (the compiled contenders are left out on the CPU). The GPU run measures the same on
GPT-2 small and medium."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


def test_the_peers_section_runs_every_contender_and_memplan_keeps_to_each_peak(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_check

    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--device", "cpu", "--tiny", "--sections", "peers", "--peer-rounds", "1",
                           "--out", str(out)]) == 0
    rows = {r["contender"]: r for r in json.loads(out.read_text())["sections"]["peers"]}
    peers = ("hf-gc", "ckpt-seq", "titan-2", "titan-ops")
    for name in ("unplanned", *peers):
        assert rows[name]["status"] == "ok", rows[name]
    assert rows["compile"]["status"] == "not run" and "CPU" in rows["compile"]["message"]
    for variant in ("memplan", "memplan-sel"):
        for peer in peers:
            r = rows[f"{variant}@{peer}"]
            assert r["status"] == "ok", r
            # planned for the peer's measured peak, measured within it and near its prediction
            assert r["predicted_peak_bytes"] <= r["budget_bytes"] == rows[peer]["peak_bytes"]
            assert abs(r["peak_bytes"] - r["predicted_peak_bytes"]) <= 0.01 * r["peak_bytes"]
            assert r["max_grad_diff"] == 0.0  # recomputation changes no gradient bit
    sys.modules.pop("gpu_check", None)

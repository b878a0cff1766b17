"""A user's training runs to fit a law to: (parameters, tokens, final loss) per run.

Read from a CSV or JSON file, JSON text or Python data, with columns `params`, `tokens` (or `flops`,
from which tokens = flops / (6 params)) and `loss`. Other column names map with `columns=`, e.g.
Epoch's extraction of the Chinchilla data: `{"params": "Model Size", "flops": "Training FLOP"}`.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from memplan.planner.scaling.errors import ScalingError
from memplan.planner.scaling.laws import FLOPS_PER_PARAM_TOKEN

__all__ = ["Runs", "load_runs"]

_FIELDS = ("params", "tokens", "flops", "loss")


@dataclass(frozen=True)
class Runs:
    """Validated runs: arrays of equal length, every value finite and > 0."""

    params: np.ndarray  # [n] N
    tokens: np.ndarray  # [n] D
    loss: np.ndarray  # [n] final loss, nats per token
    source: str = ""

    @property
    def n(self) -> int:
        return int(self.params.size)

    @property
    def flops(self) -> np.ndarray:
        """[n] training FLOPs, 6 N D."""
        return FLOPS_PER_PARAM_TOKEN * self.params * self.tokens

    def drop_highest_loss(self, k: int) -> Runs:
        """These runs without the `k` of highest loss (Epoch's outlier rule drops 5)."""
        if k <= 0:
            return self
        keep = np.sort(np.argsort(self.loss, kind="stable")[: max(self.n - k, 0)])
        return Runs(self.params[keep], self.tokens[keep], self.loss[keep], self.source)

    def subset(self, index: np.ndarray) -> Runs:
        return Runs(self.params[index], self.tokens[index], self.loss[index], self.source)


def _rows_from_text(text: str, *, where: str, fmt: str | None) -> list[Mapping[str, Any]]:
    stripped = text.lstrip()
    if fmt == "json" or (fmt is None and stripped[:1] in "[{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ScalingError(
                f"runs: {where} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})"
            ) from None
        return _rows_from_data(data, where=where)
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames:
        raise ScalingError(f"runs: {where} is empty; it needs a header row and one row per run")
    return list(reader)


def _rows_from_data(data: Any, *, where: str) -> list[Mapping[str, Any]]:
    if isinstance(data, Mapping) and "runs" in data:
        data = data["runs"]
    if isinstance(data, Mapping):  # columnar: {"params": [...], "tokens": [...], ...}
        lengths = {len(v) for v in data.values() if isinstance(v, (list, tuple))}
        if len(lengths) != 1:
            raise ScalingError(f"runs: {where}: columns must be lists of equal length")
        n = lengths.pop()
        return [{k: v[i] for k, v in data.items()} for i in range(n)]
    if isinstance(data, (list, tuple)) and all(isinstance(r, Mapping) for r in data):
        return list(data)
    raise ScalingError(
        f"runs: {where}: expected a list of runs like {{\"params\": 1e9, \"tokens\": 2e10, "
        "\"loss\": 2.5}, or columns of such values"
    )


def _column(rows: list[Mapping[str, Any]], name: str, *, field: str) -> np.ndarray:
    out = np.empty(len(rows))
    for i, row in enumerate(rows):
        raw = row.get(name)
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            raise ScalingError(f"runs: row {i + 1}: {field} ({name!r}) is missing")
        try:
            v = float(raw)
        except (TypeError, ValueError):
            raise ScalingError(f"runs: row {i + 1}: {field} ({name!r}) is not a number: {raw!r}") from None
        if not math.isfinite(v):
            raise ScalingError(f"runs: row {i + 1}: {field} is {raw}; every value must be finite")
        if v <= 0:
            raise ScalingError(f"runs: row {i + 1}: {field} must be greater than 0, got {v:g}")
        out[i] = v
    return out


def load_runs(
    source: str | Path | Iterable[Mapping[str, Any]] | Mapping[str, Any] | Runs,
    *,
    columns: Mapping[str, str] | None = None,
    fmt: str | None = None,
) -> Runs:
    """`Runs` from a path (CSV or JSON, by extension or content), JSON text, rows or columns.

    `columns` maps our names (`params`, `tokens`, `flops`, `loss`) to the file's. Raises
    `ScalingError` naming the missing column or the bad row.
    """
    if isinstance(source, Runs):
        return source
    names = {f: f for f in _FIELDS}
    for key, val in (columns or {}).items():
        if key not in _FIELDS:
            raise ScalingError(f"columns: unknown key {key!r}; map any of {', '.join(_FIELDS)}")
        names[key] = val
    where = "the runs"
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source
                                    and not source.lstrip().startswith(("[", "{"))):
        path = Path(source)
        if not path.exists():
            raise ScalingError(f"runs: no such file {str(path)!r}")
        where = str(path)
        if fmt is None and path.suffix.lower() in (".json", ".csv"):
            fmt = path.suffix.lower()[1:]
        rows = _rows_from_text(path.read_text(), where=where, fmt=fmt)
    elif isinstance(source, str):
        rows = _rows_from_text(source, where=where, fmt=fmt)
    else:
        rows = _rows_from_data(source if isinstance(source, Mapping) else list(source), where=where)
    if not rows:
        raise ScalingError(f"runs: {where} holds no runs")
    header = set().union(*(r.keys() for r in rows))
    missing = [f for f in ("params", "loss") if names[f] not in header]
    if names["tokens"] not in header and names["flops"] not in header:
        missing.append("tokens (or flops)")
    if missing:
        have = ", ".join(sorted(map(str, header))) or "none"
        raise ScalingError(
            f"runs: {where} lacks the column(s) {', '.join(missing)}; it has {have}. Name them "
            "params, tokens (or flops) and loss, or map yours with columns= (CLI: --params-column ...)"
        )
    N = _column(rows, names["params"], field="params")
    L = _column(rows, names["loss"], field="loss")
    if names["tokens"] in header:
        D = _column(rows, names["tokens"], field="tokens")
    else:
        D = _column(rows, names["flops"], field="flops") / (FLOPS_PER_PARAM_TOKEN * N)
    return Runs(N, D, L, where)

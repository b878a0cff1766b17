"""The quickstart's main job. Until the executor lands: plan the example GPT profile."""

from __future__ import annotations

import logging
from pathlib import Path

from memplan.cli import app


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    example = Path(__file__).resolve().parent.parent / "examples" / "gpt24.json"
    for strategy in ("store-all", "sqrt", "uniform"):
        app(["plan", str(example), "--budget", "3GiB", "--strategy", strategy], standalone_mode=False)


if __name__ == "__main__":
    main()

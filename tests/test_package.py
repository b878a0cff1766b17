"""The installable package: one import root, a light `import memplan`, nothing outside the repository."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_memplan_is_light_and_its_verbs_are_the_librarys():
    code = (
        "import sys, memplan\n"
        "assert 'torch' not in sys.modules, 'import memplan loaded torch'\n"
        "assert 'memplan.planner' not in sys.modules, 'import memplan loaded the planner'\n"
        "import memplan.planner as p\n"
        "from memplan.planner.scaling import size\n"
        "assert memplan.plan is p.plan and memplan.frontier is p.frontier\n"
        "assert memplan.simulate is p.simulate and memplan.size is size\n"
        "assert 'torch' not in sys.modules, 'the planner loaded torch'\n"
        "assert set(memplan.__all__) >= {'plan', 'frontier', 'simulate', 'profile_chain', 'run_plan', 'size'}\n"
        "try:\n    memplan.nope\nexcept AttributeError as e:\n    assert 'nope' in str(e)\n"
        "else:\n    raise SystemExit('memplan.nope did not raise')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr


def test_every_package_folder_is_mapped_under_memplan():
    """pyproject.toml lists every folder with an __init__.py of the line's packages, under memplan
    (NOTE [ One import root ]): a folder left out would be missing from the wheel."""
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = cfg["package-dir"]
    assert set(dirs) == {"memplan", "memplan.profiler", "memplan.planner", "memplan.executor", "memplan.service"}
    found = set()
    for name, folder in dirs.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            found.add(".".join([name, *rel.parts]))
    # memplan's own folder holds only the CLI and the data besides itself
    assert found == set(cfg["packages"]), sorted(found ^ set(cfg["packages"]))


def test_nothing_points_outside_the_repository():
    outside = "../" + "shared"  # spelled apart, so that this file does not name it
    out = subprocess.run(["git", "grep", "-l", "-F", "-e", outside], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "", f"files that refer to {outside}: {out.stdout.split()}"


def test_epoch_data_ships_in_the_package():
    from memplan.data import dataset_path, load_dataset

    path = dataset_path("epoch")
    assert path.is_file() and path.read_text().count("\n") == 246  # header + 245 points
    runs = load_dataset("epoch")
    assert len(runs.loss) == 240  # less Epoch's 5 outliers

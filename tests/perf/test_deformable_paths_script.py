"""benchmarks/deformable_paths.py at small sizes, so that the figures behind `MultiScaleDeformableAttention.path`
stay reproducible."""

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "deformable_paths.py"


def load_script():
    spec = importlib.util.spec_from_file_location("deformable_paths_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_paths_and_a_training_step_are_timed(capsys):
    script = load_script()
    assert script.main(["--img-size", "64x96", "--rounds", "1", "--batch", "2"]) == 0
    rows = [
        line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| encoder") or line.startswith("| decoder")
    ]
    assert len(rows) == 2 * len(script.MODES)  # every case and mode, each path's time and the ratios
    assert all(len(row.split("|")) == 9 and row.count("x |") == 2 for row in rows)
    assert script.main(["--img-size", "64x64", "--rounds", "1", "--train-step", "deformable_detr_digits"]) == 0
    assert "reference (math)" in capsys.readouterr().out

"""benchmarks/deformable_paths.py at small sizes, so that the figures behind `MultiScaleDeformableAttention.path`
stay reproducible."""


def test_paths_and_a_training_step_are_timed(capsys, load_benchmark):
    script = load_benchmark("deformable_paths")
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

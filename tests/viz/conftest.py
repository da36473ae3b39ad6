"""Fixtures of the figure tests."""

import pytest
from matplotlib.figure import Figure


@pytest.fixture
def saved_figures(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """Every matplotlib Figure saved while the test runs (`savefig` still writes it), in order, to read what it
    draws."""
    saved: list[Figure] = []
    savefig = Figure.savefig

    def recording(figure: Figure, *args, **kwargs) -> None:
        saved.append(figure)
        savefig(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording)
    return saved

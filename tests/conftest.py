import os

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_thread_per_worker():
    """Under pytest-xdist every worker takes one core: torch threads beyond that only spin against each other."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
    yield

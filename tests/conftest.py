import os

import huggingface_hub.constants
import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_thread_per_worker():
    """Under pytest-xdist every worker takes one core: torch threads beyond that only spin against each other."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
    yield


@pytest.fixture(scope="module")
def hub_offline():
    """No Hub look-ups while a module builds transformers models offline (its tests use this fixture through
    `pytestmark`): transformers reads huggingface_hub's flag on every call."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        yield


@pytest.fixture
def native_bf16(monkeypatch):
    """Attention's dispatch as on a CPU with bf16 instructions and no AMX tiles (AVX512-BF16), on whatever CPU runs
    the test: the paths `auto` takes only there are then checked everywhere (on other CPUs they are slow, not
    wrong)."""
    from vitkit.kernels import policy

    monkeypatch.setattr(policy, "native_cpu_bf16", lambda: True)
    monkeypatch.setattr(policy, "cpu_amx", lambda: False)

import os
import sys

import pytest

# Set before torch loads libgomp, which reads it once (torch is imported by pytest_configure below, after
# this file, and by the test modules): OpenMP threads that spin-wait while another process holds the core
# slow every small op down several-fold on a loaded machine. The training subprocesses the tests start
# inherit it. posenc-lab's CLI sets the same (posenc_lab/cli.py); importing posenc_lab does not.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_configure(config):
    import torch

    # Test tensors are tiny: extra intra-op threads only add contention (up to 100x slower per op on a
    # loaded 2-core machine).
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _stop_wandb_service():
    """A test that starts wandb leaves its service running and its address in WANDB_SERVICE, which
    later tests' subprocesses would inherit and try to reach: stop it after every such test."""
    yield
    if "wandb" in sys.modules and os.environ.get("WANDB_SERVICE"):
        sys.modules["wandb"].teardown()
        os.environ.pop("WANDB_SERVICE", None)

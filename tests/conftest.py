import torch

# Test tensors are tiny: extra intra-op threads only add contention (up to 100x slower per op on a
# loaded 2-core machine).
torch.set_num_threads(1)


import os
import sys

import pytest


@pytest.fixture(autouse=True)
def _stop_wandb_service():
    """A test that starts wandb leaves its service running and its address in WANDB_SERVICE, which
    later tests' subprocesses would inherit and try to reach: stop it after every such test."""
    yield
    if "wandb" in sys.modules and os.environ.get("WANDB_SERVICE"):
        sys.modules["wandb"].teardown()
        os.environ.pop("WANDB_SERVICE", None)

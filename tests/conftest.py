import importlib.util
import os
import sys
from pathlib import Path

import pytest

import posenc_lab

# The wait policy of the command line (posenc_lab.prefer_passive_openmp, its one owner), set before torch loads
# libgomp, which reads it once (torch is imported by pytest_configure below, after this file, and by the test
# modules): OpenMP threads that spin-wait while another process holds the core slow every small op down
# several-fold on a loaded machine. The training subprocesses the tests start inherit it.
posenc_lab.prefer_passive_openmp()

# analysis/ installs as the package posenc_lab_analysis (setup.py). The tests import it by that name from
# this checkout, whatever is installed: a bare checkout has no such name, and an editable install may
# point at another checkout (a git worktree).
_ANALYSIS = Path(__file__).resolve().parents[1] / "analysis"
_spec = importlib.util.spec_from_file_location(
    "posenc_lab_analysis", _ANALYSIS / "__init__.py", submodule_search_locations=[str(_ANALYSIS)]
)
sys.modules["posenc_lab_analysis"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sys.modules["posenc_lab_analysis"])


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


# ---- shared fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """One corpus cache for every test's tiny runs (the small corpora of tests/helpers_train.CORPUS)."""
    return tmp_path_factory.mktemp("corpus-cache")


@pytest.fixture(scope="session")
def finished(tmp_path_factory, cache):
    """A finished 4-step run (the recall probe, tiny model, checkpoints every 2 steps): its directory. Tests
    copy it before changing anything in it."""
    from posenc_lab.train import train  # torch and Lightning load when a test asks for a run, not at collection
    from tests.helpers_train import compose_config, tiny

    run = tmp_path_factory.mktemp("finished") / "run"
    train(compose_config("train", tiny(run, cache, "checkpoint_every=2", steps=4)))
    return run


@pytest.fixture(scope="session")
def tiny_ablation(tmp_path_factory):
    """`posenc-lab ablate experiment=tiny` (two at a time): the grid's run directories under runs/ and the report
    under report/. Tests copy what they change."""
    from posenc_lab_analysis import ablate

    out = tmp_path_factory.mktemp("ablate") / "tiny"
    assert ablate.main(["experiment=tiny", f"ablate.out={out}", "ablate.jobs=2"]) == 0
    return out

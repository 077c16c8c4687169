"""docs/EXTENDING.md's promise: a scheme written by its recipe, two files and nothing else edited, passes the whole
default test suite. Proven in a copy of the repository (the tracked files), with the new scheme's module and yaml
added, running `python -m pytest` there as CI does. Slow: the whole suite runs a second time
(`pytest -m slow tests/test_extending.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAME = "recipe_slope"
# The recipe's first file: a relative bias, its options as keywords, its row of the table of schemes.
MODULE = f'''"""A fixed linear distance penalty per head: scores - slope * (h + 1) / H * (i - j)."""

import torch

from .base import Dims, DistanceBias, PositionalScheme, Positions
from .registry import register


@register
class RecipeSlope(PositionalScheme):
    name = "{NAME}"
    kind = "relative"
    family = "relative bias"
    positions_enter = "`-slope (h + 1) / H (i - j)`"
    with_memory = "works"

    def __init__(self, dims: Dims, *, slope: float = 0.5):
        super().__init__(dims)
        if not slope > 0:
            raise ValueError(f"{NAME}: posenc.slope must be a number > 0, got {{slope!r}}")
        heads = torch.arange(1, dims.n_head + 1, dtype=torch.float32) / dims.n_head
        self.register_buffer("slopes", slope * heads, persistent=False)

    def table(self, d: torch.Tensor) -> torch.Tensor:
        """d: [...] distances -> [H, ...] -slope_h d."""
        return -self.slopes.view((-1,) + (1,) * d.dim()) * d.to(self.slopes.dtype)

    def score_bias(self, layer: int, pos: Positions, context=None) -> DistanceBias:
        return DistanceBias(self.table)
'''
# The recipe's second file: its name and every option with its value.
YAML = f"# A fixed linear distance penalty per head.\nname: {NAME}\nslope: 0.5\n"


@pytest.mark.slow
def test_a_scheme_written_by_the_recipe_passes_the_whole_suite(tmp_path):
    copy = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in filter(None, files.split("\0")):
        source = ROOT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            (copy / name).write_bytes(source.read_bytes())
    (copy / "posenc_lab" / "positional" / f"{NAME}.py").write_text(MODULE)
    (copy / "conf" / "posenc" / f"{NAME}.yaml").write_text(YAML)
    # the copy's packages first (python -m puts the working folder first), the corpus cache apart
    env = {**os.environ, "POSENC_LAB_CACHE": str(tmp_path / "cache")}
    check = subprocess.run(
        [sys.executable, "-c", f"from posenc_lab.positional import SCHEMES; print(SCHEMES['{NAME}'].__module__)"],
        cwd=copy, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert check.stdout.strip() == f"posenc_lab.positional.{NAME}", check.stderr[-2000:]  # the copy's scheme found
    suite = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"],
        cwd=copy, env=env, capture_output=True, text=True,
    )  # fmt: skip
    tail = "\n".join(suite.stdout.splitlines()[-25:])
    assert suite.returncode == 0, f"the suite failed with the recipe's scheme added:\n{tail}"
    assert " passed" in tail and NAME in (copy / "conf" / "posenc" / f"{NAME}.yaml").read_text()

"""A scheme is one module and one yaml: a throwaway scheme, written to a temporary module and a temporary
config folder (a Hydra search path), is taken by training, the benchmark, ablate's grid and the report's
ordering with no other edit."""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest

from posenc_lab import bench
from posenc_lab.model import ModelConfig
from posenc_lab.positional import SCHEMES, scheme_names, schemes_of_kind

NAME = "throwaway_slope"
SOURCE = f'''
"""A fixed linear distance penalty: scores - slope * (i - j), the same for every head."""

from posenc_lab.positional import PositionalScheme, register


@register
class ThrowawaySlope(PositionalScheme):
    name = "{NAME}"
    kind = "relative"

    def __init__(self, dims, *, slope: float = 0.5):
        super().__init__(dims)
        self.slope = float(slope)

    def score_bias(self, layer, pos, context=None):
        return -self.slope * pos.distance.clamp(min=0).float()

    def extra_flops(self, segment_len, mem_len, batch_size=1):
        return 7.0 * segment_len  # a declared cost, so that the benchmark's count shows it asked
'''


@pytest.fixture(scope="module")
def scheme(tmp_path_factory):
    """The module imported (so registered) and conf/posenc/<name>.yaml in a search-path folder."""
    root = tmp_path_factory.mktemp("new_scheme")
    module = root / f"{NAME}.py"
    module.write_text(SOURCE)
    (root / "conf" / "posenc").mkdir(parents=True)
    (root / "conf" / "posenc" / f"{NAME}.yaml").write_text(f"name: {NAME}\nslope: 0.25\n")
    spec = importlib.util.spec_from_file_location(f"_test_scheme_{NAME}", module)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    yield f"hydra.searchpath=[file://{root / 'conf'}]"
    SCHEMES.pop(NAME, None)
    sys.modules.pop(spec.name, None)


def test_the_registry_and_the_benchmark_take_it(scheme, tmp_path):
    assert NAME in scheme_names() and NAME in schemes_of_kind("relative")
    cfg = ModelConfig(n_layer=2, d_model=32, n_head=2, d_inner=64, posenc=NAME)
    nope = ModelConfig(n_layer=2, d_model=32, n_head=2, d_inner=64, posenc=schemes_of_kind("none")[0])
    # the FLOP count adds what the scheme declares: 7 L per layer, per predicted token 2 layers x 7
    assert bench.model_flops_per_token(cfg, 16, 8, training=False) == pytest.approx(
        bench.model_flops_per_token(nope, 16, 8, training=False) + 2 * 7.0
    )
    assert (
        bench.main(
            [
                "--configs",
                "tiny",
                "--segment-len",
                "8",
                "--batch",
                "2",
                "--model-set",
                "d_model=32,n_head=2",
                "--schemes",
                NAME,
                "--memory",
                "on",
                "--warmup",
                "0",
                "--reps",
                "1",
                "--matmul-max-n",
                "256",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert (tmp_path / "bench.md").read_text().count(f"| {NAME} |") == 1


def test_ablate_grid_trains_it_and_the_report_orders_it(scheme, tmp_path):
    from posenc_lab.ablate.plan import plan
    from posenc_lab.compose import compose
    from posenc_lab.train import train
    from posenc_lab_analysis.runs import load_run, scheme_order

    cache = tmp_path / "cache"
    user = [
        "experiment=tiny",
        f"ablate.schemes=[{NAME}]",
        "ablate.recurrence=[true]",
        "ablate.half_loss.schemes=[]",
        "ablate.recall.schemes=[]",
        f"ablate.out={tmp_path / 'ablate'}",
        scheme,
        f"data.root={cache}",
        "data.corpus.max_bytes=200000",
        "trainer.max_steps=2",
        "final_eval.limit_batches=1",
    ]
    specs = plan(compose("ablate", user), user)
    assert [s.scheme for s in specs] == [NAME]
    run_dir = tmp_path / "run"  # what ablate's training process runs: the spec's overrides, composed
    train(compose("train", [*specs[0].overrides, f"run_dir={run_dir}"]))
    run = load_run(run_dir)
    assert run.scheme == NAME and math.isfinite(run.results["test"]["loss"])
    assert run.model().scheme.slope == 0.25  # the yaml's option reached the model
    order = scheme_order()
    relative = [s for s in order if s in schemes_of_kind("relative")]
    assert NAME in relative and order.index(NAME) > max(order.index(s) for s in schemes_of_kind("absolute"))

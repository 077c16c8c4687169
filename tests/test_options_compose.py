"""Options compose or are refused: every registered scheme with every pair of the model's composable options
(``OPTIONS``) is composed through the real conf/ (``posenc_lab.compose``) and judged by the validator
(``posenc_lab.checks``), then either refused there, each problem one line naming an option of the pair, or built from
that config and trained forward and backward over two segments (the second reads the first's memory), with a finite
loss and a finite gradient for every parameter that should take one.

The default run takes a covering subset: every pair of options once, the pairs dealt to the schemes in turn, so every
scheme meets a few pairs and every pair a scheme. ``pytest -m slow`` runs the whole product, every scheme with every
pair. A new option is one entry of ``OPTIONS``; a new scheme joins by the registry.

Options the table leaves out, and why: the output layer's (``adaptive_cutoffs``, ``output_bias``, ``tie_weights``,
``loss_recent_frac``) and the initialisation's (``init``, ``ff_activation``) never meet a scheme; ``attention_impl``
chooses a path, not a model, and its fused path trains on CUDA only (tests/positional/test_fused.py compares the two).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest
import torch

from posenc_lab.build import model_config
from posenc_lab.checks import problems
from posenc_lab.compose import Composer
from posenc_lab.model import MemoryTransformer
from posenc_lab.positional import SCHEME_NAMES
from tests.helpers_train import CONF_DIR
from tests.schemes import FOX, HYBRID, NOPE, ROPE

V, B, L, M, K = 23, 2, 8, 8, 3  # vocabulary, streams, segment, memory, DroPE's step
# a tiny model without memory: each option states what it changes
BASE = [
    "model=tiny", "model.n_layer=2", "model.d_model=16", "model.n_head=2", "model.d_inner=32", "model.dropout=0.0",
    "model.mem_len=0", "data=recall", f"data.segment_len={L}", f"data.batch_size={B}", "data.episode_len=null",
]  # fmt: skip
# the scheme's own config: a hybrid of two layers (its yaml's four would be refused on two)
SCHEME_BASE = {HYBRID: {"posenc.layers": f"[{ROPE},{FOX}]"}}


@dataclass(frozen=True)
class Option:
    """One composable option: the overrides that set it ({s}: the scheme's name), the key a refusal of it names, and
    how the model is run with it (a static memory; the optimizer steps the weights have taken)."""

    name: str
    overrides: dict[str, str]
    key: str
    static_memory: bool = False
    step: int = 0


OPTIONS = [
    Option("memory", {"model.mem_len": str(M)}, "model.mem_len"),
    Option("static_memory", {"model.mem_len": str(M)}, "model.mem_len", static_memory=True),
    Option("same_length", {"model.mem_len": str(M), "model.same_length": "true"}, "model.same_length"),  # a window
    Option("post_norm", {"model.pre_norm": "false"}, "model.pre_norm"),
    Option("dropout", {"model.dropout": "0.1", "model.attn_dropout": "0.1", "model.pos_dropout": "0.1"}, "dropout"),
    Option("ssmax", {"model.softmax_scale": "ssmax"}, "model.softmax_scale"),
    Option("sink", {"model.attention_sink": "true"}, "model.attention_sink"),
    Option("gate", {"model.output_gate": "true"}, "model.output_gate"),
    Option("drope_before", {"+posenc.drop_at_step": str(K)}, "posenc.drop_at_step", step=K - 1),
    Option("drope_after", {"+posenc.drop_at_step": str(K)}, "posenc.drop_at_step", step=K),
    Option("hybrid", {"posenc": HYBRID, "posenc.layers": f"[{{s}},{NOPE}]"}, "posenc.layers"),
    Option(
        "window",
        {"posenc": HYBRID, "posenc.layers": f"[{{s}},{NOPE}]", "posenc.windows": "{{{s}:4}}"},
        "posenc.layers",  # a layer the hybrid refuses is named there; a window refused by an option, by that option
    ),
    Option("random_positions", {"+model.random_positions": "64"}, "model.random_positions"),
]
BY_NAME = {o.name: o for o in OPTIONS}


def compatible(a: Option, b: Option) -> bool:
    """Two options that set one key to two values are alternatives (DroPE before and after its step), not a pair."""
    return a.step == b.step or not ({"+posenc.drop_at_step"} & a.overrides.keys() & b.overrides.keys())


PAIRS = [(a.name, b.name) for a, b in itertools.combinations(OPTIONS, 2) if compatible(a, b)]
FULL = [(s, a, b) for s in SCHEME_NAMES for a, b in PAIRS]
COVERING = [(SCHEME_NAMES[i % len(SCHEME_NAMES)], a, b) for i, (a, b) in enumerate(PAIRS)]
assert len(COVERING) >= len(SCHEME_NAMES), "fewer pairs than schemes: deal each scheme a pair"


@pytest.fixture(scope="module")
def composer():
    with Composer(CONF_DIR, "train") as composer:
        yield composer


def overrides(scheme: str, options: list[Option]) -> list[str]:
    """The command line of ``scheme`` with ``options``: the scheme's own, then each option's (the scheme's name put
    in); a key set twice takes one value (memory and static memory)."""
    values = {"posenc": scheme, **SCHEME_BASE.get(scheme, {})}
    for option in options:
        values.update({k: v.format(s=scheme) for k, v in option.overrides.items()})
    group = [f"posenc={values.pop('posenc')}"]  # the group first: the keys below set its options
    return [*BASE, *group, *(f"{k}={v}" for k, v in values.items())]


def run(model: MemoryTransformer, static_memory: bool, step: int) -> torch.Tensor:
    """Two segments of training, the second over the first's memory (a static one: M slots, some not yet valid);
    the second asks for the attention too (each scheme's ``attention_probs``). Returns the summed loss."""
    torch.manual_seed(0)
    model.train().at_step(step)
    x = torch.randint(V, (2, B, L + 1))
    mems = model.empty_memory(B, model.mem_len, x.device) if static_memory else None
    total = torch.zeros(())
    for segment in range(2):
        out = model(x[segment, :, :-1], x[segment, :, 1:], mems=mems, offset=segment * L, return_attention=segment == 1)
        total, mems = total + out.loss, out.mems
    if model.mem_len:
        assert out.attention[0].shape[-1] == L + min(M, L), "the second segment attends to the first's memory"
    total.backward()
    return total


def check_case(composer: Composer, scheme: str, pair: tuple[str, str]) -> None:
    options = [BY_NAME[name] for name in pair]
    cfg = composer.compose_trial(overrides(scheme, options), BASE)  # as a sweep's trials: Hydra's compose, cached
    found = problems(cfg)
    if found:  # refused before compute: one line a problem, each naming an option of the pair
        assert problems(composer.compose_trial(overrides(scheme, []), BASE)) == [], "the scheme alone"
        for line in found:
            assert "\n" not in line and any(o.key in line for o in options), (scheme, pair, found)
        return
    torch.manual_seed(0)
    model = MemoryTransformer(model_config(cfg, V))
    model.validate_lengths(L, model.mem_len)
    loss = run(model, any(o.static_memory for o in options), max(o.step for o in options))
    assert math.isfinite(loss.item()), (scheme, pair, loss)
    dropped = {id(p) for p in model.scheme.parameters()} if getattr(model.scheme, "dropped", False) else set()
    for name, param in model.named_parameters():
        if id(param) in dropped:  # DroPE from its step: the scheme's own parameters take no more gradient
            assert param.grad is None, (scheme, pair, name)
            continue
        assert param.grad is not None, f"{scheme} {pair}: {name} has no gradient"
        assert torch.isfinite(param.grad).all(), f"{scheme} {pair}: {name}'s gradient is not finite"


@pytest.mark.parametrize("scheme, a, b", COVERING, ids=[f"{s}-{a}-{b}" for s, a, b in COVERING])
def test_every_pair_of_options_composes_or_is_refused_in_one_line(composer, scheme, a, b):
    check_case(composer, scheme, (a, b))


@pytest.mark.slow
@pytest.mark.parametrize("scheme, a, b", FULL, ids=[f"{s}-{a}-{b}" for s, a, b in FULL])
def test_every_scheme_with_every_pair_of_options(composer, scheme, a, b):
    check_case(composer, scheme, (a, b))

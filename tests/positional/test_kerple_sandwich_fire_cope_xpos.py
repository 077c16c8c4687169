"""kerple_log, kerple_power, sandwich, fire, cope and xpos against naive per-pair references written from
docs/SCHEMES.md, forward and backward, with and without memory; the invariants each declares; their options,
and training and evaluation through the entry points."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_lab.model import MemoryTransformer, ModelConfig
from posenc_lab.positional import SCHEMES, fused, schemes_of_kind
from tests.positional.naive_kerple_sandwich_fire_cope_xpos import (
    BIAS,
    NEW,
    _seed,  # noqa: F401 - an autouse fixture
    assert_equals_naive,
    naive_attend,
    new_scheme,
)
from tests.positional.test_fused import (
    reference,  # noqa: F401 (a fixture)
)
from tests.positional.test_schemes import (
    MASKS,
    H,
    inputs,
    make_positions,
    make_scheme,
    qkv,
)
from tests.schemes import COPE, FIRE, KERPLE_LOG, KERPLE_POWER, SANDWICH, STICKBREAKING, XPOS


@pytest.mark.parametrize("L, M, same_length", MASKS)
@pytest.mark.parametrize("name", NEW)
def test_new_schemes_equal_naive_forward_and_backward(name, L, M, same_length):
    """With and without memory (M = 0, M < L, M = L, M > L) and the same-length mask; the unfused path."""
    scheme = new_scheme(name).train()
    scheme.attention_impl = "unfused"
    q, k, v = (x.requires_grad_() for x in qkv(L, M))
    assert_equals_naive(name, scheme, q, k, v, make_positions(L, M, same_length))


@pytest.mark.parametrize("L, M, same_length", [(5, 0, False), (4, 9, False), (5, 3, True)])
@pytest.mark.parametrize("name", BIAS)
def test_bias_schemes_fused_path_equals_naive(reference, name, L, M, same_length):  # noqa: F811
    """KERPLE, Sandwich and FIRE through flex_attention (uncompiled reference on CPU): the same score_mods
    that CUDA compiles, their tables' and FIRE's MLP gradients included."""
    scheme = new_scheme(name).train()
    scheme.attention_impl = "fused"
    q, k, v = (x.requires_grad_() for x in qkv(L, M))
    assert_equals_naive(name, scheme, q, k, v, make_positions(L, M, same_length))


@pytest.mark.slow  # compiles flex_attention for the CPU: 15-60 s per scheme on 2 shared cores
@pytest.mark.parametrize("name", BIAS)
def test_compiled_cpu_forward_equals_naive(name):
    """What attention_impl=fused runs in CPU evaluation: the compiled kernel of each score_mod, no gradient."""
    scheme, (L, M) = new_scheme(name), (5, 9)
    scheme.attention_impl = "fused"
    pos, (q, k, v) = make_positions(L, M, same_length=True), qkv(L, M)
    with torch.no_grad():
        want = naive_attend(name, scheme, 1, q, k, v, pos)
        torch.testing.assert_close(scheme.attend(1, q, k, v, pos, 0.0), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", BIAS)
def test_bias_schemes_auto_rule_is_alibis_or_t5s(name, monkeypatch):
    """auto: never on CPU; on CUDA a learned bias fuses from any key count (as t5), a fixed one never (as alibi)."""
    scheme = make_scheme(name)
    assert scheme.fused_from_keys == (None if name == SANDWICH else 0)
    on_cuda = type("Q", (), {"device": torch.device("cuda")})()
    assert fused.use_fused(scheme, on_cuda, torch.empty(1, 1, 64, 1), 0.0) is (name != SANDWICH)
    monkeypatch.setattr(fused, "_flex", lambda: pytest.fail("flex_attention called on CPU"))
    q, k, v = qkv(5, 3)
    scheme.attend(1, q.requires_grad_(), k, v, make_positions(5, 3), 0.0).sum().backward()


@pytest.mark.parametrize("name", schemes_of_kind("relative"))
def test_translation_invariance_holds_unless_declared(name):
    """Same content at the same distance, moved later in the sequence: a scheme that promises translation
    invariance scores the pair the same (the difference of two log-probabilities of one row is a difference of
    scores); FIRE (past its threshold) and CoPE (other keys in between) declare that they do not, and do not."""
    # FIRE past its threshold; stick-breaking with its own key (distance 0) taking a share
    options = {FIRE: {"init_threshold": 1.0}, STICKBREAKING: {"attend_current": True}}.get(name, {})
    scheme, (L, M) = make_scheme(name, **options), (8, 0)
    pos, (q, k, _) = make_positions(L, M), qkv(L, M)
    t = 3
    q[:, :, 2 + t] = q[:, :, 2]  # query 2 and query 5 alike, and their keys at distances 0 and 2 alike
    k[:, :, 2 + t], k[:, :, t] = k[:, :, 2], k[:, :, 0]
    with torch.no_grad():
        logp = scheme.attention_probs(0, q, k, pos, inputs(L, M)).log()
    early, late = logp[..., 2, 2] - logp[..., 2, 0], logp[..., 2 + t, 2 + t] - logp[..., 2 + t, t]
    if SCHEMES[name].not_translation_invariant is None:
        torch.testing.assert_close(late, early, atol=1e-5, rtol=1e-5)
    else:
        assert (late - early).abs().max() > 1e-3, SCHEMES[name].not_translation_invariant


def test_documented_options_exist():
    from posenc_lab.positional import scheme_options

    assert scheme_options(KERPLE_LOG) == scheme_options(KERPLE_POWER) == {}
    assert scheme_options(SANDWICH) == {"dim": None}
    assert scheme_options(FIRE) == {"width": 32, "init_c": 1.0, "init_threshold": None}
    assert scheme_options(COPE) == {"max_position": None, "overflow": "clamp"}
    assert scheme_options(XPOS) == {"base": 10000.0, "gamma": 0.4, "scale_base": 512.0}


@pytest.mark.parametrize(
    "name, options, match",
    [
        (SANDWICH, {"dim": 7}, "dim .*even integer >= 2, got 7"),
        (FIRE, {"width": 0}, "width .*>= 1, got 0"),
        (FIRE, {"init_c": 0.0}, "init_c must be a number >= 0.01, got 0.0"),
        (FIRE, {"init_threshold": 0.5}, "init_threshold must be a number >= 1.0, got 0.5"),
        (XPOS, {"gamma": -0.4}, "gamma must be a number > 0, got -0.4"),
        (XPOS, {"scale_base": 0}, "scale_base must be a number > 0, got 0"),
    ],
)
def test_bad_options_raise_naming_the_value(name, options, match):
    with pytest.raises(ValueError, match=match):
        make_scheme(name, **options)


def test_kerple_and_sandwich_biases_start_at_zero_and_fall():
    """b(0) = 0 and b(d) < 0 for d > 0, every head; KERPLE's penalty grows with the distance, Sandwich's ripples
    (a sum of cosines: with d_bar = 4 channels, cos(d) + cos(d / 100) - 2)."""
    d = torch.arange(0, 12.0)
    for name in (KERPLE_LOG, KERPLE_POWER, SANDWICH):
        scheme = new_scheme(name)
        bias = scheme.bias(0, d) if name != SANDWICH else scheme.table(d)
        assert (bias[:, 0] == 0).all() and (bias[:, 1:] < 0).all(), name
        assert bool((bias.diff(dim=-1) < 0).all()) is (name != SANDWICH), name
    head_1 = (torch.cos(d) + torch.cos(d / 100) - 2) / (8 / H)
    torch.testing.assert_close(make_scheme(SANDWICH).table(d)[0], head_1)


def test_every_new_scheme_trains_with_memory_and_episode_resets():
    """Two layers, memory, an episode reset (memory dropped, offset back to 0) in the middle: finite loss,
    a gradient for every parameter of the scheme."""
    for name in NEW:
        options = {FIRE: {"init_threshold": 8.0}, COPE: {"max_position": 16}}.get(name, {})
        cfg = ModelConfig(vocab_size=23, n_layer=2, d_model=16, n_head=2, d_inner=32, mem_len=8, posenc=name)
        cfg.posenc_kwargs = options
        model = MemoryTransformer(cfg).train()
        x = torch.randint(23, (3, 2, 8))
        mems, loss = None, 0.0
        for seg in range(3):
            offset = 8 * seg if seg < 2 else 0
            out = model(x[seg], x[seg].roll(-1, 1), mems=mems if seg < 2 else None, offset=offset)
            mems, loss = out.mems, loss + out.loss
        loss.backward()
        assert torch.isfinite(loss), name
        for pname, p in model.scheme.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.any(), (name, pname)


@pytest.mark.parametrize("name", NEW)
def test_each_new_scheme_trains_and_evaluates_past_its_training_memory(name, tmp_path):
    """The entry points with no other edit: Hydra's posenc=<name> trains (lengths sized by the scheme), and the
    checkpoint evaluates at three times the training memory (CoPE's counts clamped at max_position, FIRE's
    queries past their threshold)."""
    from posenc_lab.evaluate import evaluate_checkpoint
    from posenc_lab.train import train
    from tests.helpers_train import compose_config, tiny

    results = train(compose_config("train", tiny(tmp_path / "run", tmp_path / "cache", f"posenc={name}", steps=2)))
    longer = evaluate_checkpoint(results["checkpoint"], mem_len=48, max_batches=2)
    assert math.isfinite(longer["loss"]) and longer["mem_len"] == 48

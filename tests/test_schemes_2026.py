"""The schemes of issue 21 (kerple_log, kerple_power, sandwich, fire, cope, xpos) against naive per-pair
references written from docs/SCHEMES.md, forward and backward, with and without memory; the invariants each
declares; and what each paper leaves open, pinned.

The references loop over (query, key) pairs and use the papers' own formulations where the implementation
takes a shortcut: FIRE's MLP is run per pair (the implementation looks up its linear pieces), CoPE
interpolates the embedding vectors (the implementation interpolates the scores), xPos multiplies each
channel by zeta^{(i-j)/B} (the implementation centres the exponents).
"""

from __future__ import annotations

import math

import pytest
import torch

from posenc_lab.model import MemoryTransformer, ModelConfig
from posenc_lab.positional import SCHEMES, fused, schemes_of_kind
from tests.schemes import COPE, FIRE, KERPLE_LOG, KERPLE_POWER, SANDWICH, STICKBREAKING, XPOS
from tests.test_fused import grads, reference  # noqa: F401 (a fixture)
from tests.test_schemes import (
    DH,
    MASKS,
    B,
    H,
    inputs,
    make_positions,
    make_scheme,
    masked_softmax,
    pe,
    qkv,
    rope_rotate,
)

NEW = (KERPLE_LOG, KERPLE_POWER, SANDWICH, FIRE, COPE, XPOS)
BIAS = (KERPLE_LOG, KERPLE_POWER, SANDWICH, FIRE)  # pure score biases: the fused path too


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def new_scheme(name: str, **options):
    """make_scheme, with the constrained parameters drawn inside their ranges (a projection would hide them)."""
    scheme = make_scheme(name, **options)
    with torch.no_grad():
        for p in (getattr(scheme, a) for a in ("r1", "r2", "c", "threshold") if hasattr(scheme, a)):
            p.uniform_(0.2, 1.8)
        if name == FIRE:
            scheme.threshold.uniform_(1.0, 6.0)
    return scheme


def naive_bias(name, scheme, layer, pos):
    """[H, L, N] the bias of each pair from its formula, or None."""
    L, N = pos.visible.shape
    bias = torch.zeros(H, L, N)
    for i in range(L):
        seen = max(int(pos.q[i] - pos.k[j]) for j in range(N) if pos.visible[i, j])  # FIRE's i
        for j in range(N):
            d = max(int(pos.q[i] - pos.k[j]), 0)
            if name == KERPLE_LOG:  # -r1 log(1 + r2 d)
                bias[:, i, j] = -scheme.r1[layer] * torch.log(1 + scheme.r2[layer] * d)
            if name == KERPLE_POWER:  # -r1 d^r2
                bias[:, i, j] = -scheme.r1[layer] * torch.tensor(float(d)) ** scheme.r2[layer]
            if name == SANDWICH:  # (PE(i) . PE(j) - d_bar/2) / (8h/H)
                dot = (pe(float(pos.q[i]), scheme.dim) * pe(float(pos.k[j]), scheme.dim)).sum()
                bias[:, i, j] = (dot - scheme.dim / 2) / (8 * torch.arange(1, H + 1) / H)
            if name == FIRE:  # f(psi(d) / psi(max(L, i))), the MLP run on this one input
                c, threshold = scheme.c[layer], scheme.threshold[layer]
                x = torch.log(1 + c * d) / torch.log(1 + c * torch.maximum(threshold, torch.tensor(float(seen))))
                bias[:, i, j] = scheme.mlp[layer](x.view(1))
    return bias


def naive_cope(scheme, layer, q, k, pos):
    """[B, H, L, N] scores: gates over the visible keys j..i, the embedding vectors interpolated at the count."""
    L, N = pos.visible.shape
    e, P = scheme.embedding[layer], scheme.max_position
    content = q @ k.transpose(-1, -2) / math.sqrt(DH)
    scores = torch.zeros(B, H, L, N)
    for i in range(L):
        for j in range(N):
            if not pos.visible[i, j]:
                continue
            count = sum(torch.sigmoid(content[:, :, i, t]) for t in range(j, N) if pos.visible[i, t])
            count = count.clamp(max=P)
            low = count.detach().floor().long()
            w = (count - low)[..., None]
            vec = (1 - w) * e[low] + w * e[(low + 1).clamp(max=P)]  # e[p], [B, H, d_h]
            scores[:, :, i, j] = content[:, :, i, j] + (q[:, :, i] * vec).sum(-1)
    return scores


def naive_xpos(scheme, q, k, pos):
    """RoPE's rotation, then each channel c times zeta_c^{(i - j)/B} (no centring: the formula of the paper)."""
    q, k = rope_rotate(q, pos.q), rope_rotate(k, pos.k)
    zeta = scheme.log_zeta.exp()  # [d_h], per channel
    scores = torch.zeros(B, H, *pos.visible.shape)
    for i in range(pos.visible.shape[0]):
        for j in range(pos.visible.shape[1]):
            decay = zeta ** (float(pos.q[i] - pos.k[j]) / scheme.scale_base)
            scores[:, :, i, j] = (q[:, :, i] * k[:, :, j] * decay).sum(-1) / math.sqrt(DH)
    return scores


def naive_attend(name, scheme, layer, q, k, v, pos):
    if name == COPE:
        scores = naive_cope(scheme, layer, q, k, pos)
    elif name == XPOS:
        scores = naive_xpos(scheme, q, k, pos)
    else:
        scores = q @ k.transpose(-1, -2) / math.sqrt(DH) + naive_bias(name, scheme, layer, pos)
    return masked_softmax(scores, pos.visible) @ v


def assert_equals_naive(name, scheme, q, k, v, pos, layer=1):
    """Output, and the gradients of q, k, v and of every parameter, against the per-pair reference."""
    inputs = [q, k, v, *scheme.parameters()]
    out = scheme.attend(layer, q, k, v, pos, 0.0)
    want = naive_attend(name, scheme, layer, q, k, v, pos)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    names = ["q", "k", "v", *dict(scheme.named_parameters())]
    for got, ref, what in zip(grads(out, inputs), grads(want, inputs), names):
        if ref is None or not ref.any():
            assert got is None or not got.any(), what
        else:
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4, msg=lambda m, what=what: f"grad of {what}: {m}")


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


# --------------------------------------------------------------------------------------------
# Declared invariants
# --------------------------------------------------------------------------------------------


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


def test_fire_below_its_threshold_is_a_function_of_the_distance():
    """In training (every query below L, the default) FIRE is translation invariant; past L it is not."""
    pos = make_positions(6, 4)
    for threshold, invariant in ((10.0, True), (2.0, False)):
        scheme = new_scheme(FIRE, init_threshold=threshold)
        with torch.no_grad():
            scheme.threshold.fill_(threshold)
            bias = scheme.score_bias(0, pos).dense(pos)  # [H, L, N]; distance 1: (i, M + i - 1)
        diagonal = torch.stack([bias[:, i, 4 + i - 1] for i in range(1, 6)], -1)
        assert torch.allclose(diagonal, diagonal[:, :1].expand_as(diagonal), atol=1e-6) is invariant


def test_fire_query_position_is_the_keys_it_sees():
    """i = the largest visible distance: M + i with a full memory, the window minus one with same-length."""
    scheme = new_scheme(FIRE)
    with torch.no_grad():
        scheme.c.fill_(1.0)
        scheme.threshold.fill_(1.0)
        x_full = scheme.inputs(0, make_positions(4, 5))
        x_window = scheme.inputs(0, make_positions(4, 5, same_length=True))
    # full memory: query i sees keys back to -M, its i is M + i; key column j sits at distance M + i - j
    i, j = torch.arange(4)[:, None], torch.arange(9)[None, :]
    want = torch.log1p((5 + i - j).clamp(min=0).float()) / torch.log1p(5.0 + i)
    torch.testing.assert_close(x_full, want)
    # same-length window of M + 1 = 6 keys: every query's i is 5 (its farthest key, column i, reads 1)
    visible = make_positions(4, 5, same_length=True).visible
    want = torch.log1p((5 + i - j).clamp(min=0).float()) / torch.log1p(torch.tensor(5.0))
    torch.testing.assert_close(x_window[visible], want.expand(4, 9)[visible])


def test_fire_pieces_are_the_mlp_at_ties_too():
    """The linear pieces equal the MLP run per pair, gradients included, when kinks sit exactly on inputs
    (the gpt2 init: first-layer biases 0, every kink at x = 0, the input of distance 0)."""
    scheme = new_scheme(FIRE).train()
    with torch.no_grad():
        for mlp in scheme.mlp:
            mlp[0].bias.zero_()
    q, k, v = (x.requires_grad_() for x in qkv(5, 3))
    assert_equals_naive(FIRE, scheme, q, k, v, make_positions(5, 3))


@pytest.mark.parametrize("max_position, same_length", [(20, False), (20, True), (2, False)])
def test_cope_counts_the_visible_gates_and_clamps_at_its_maximum(max_position, same_length):
    """q . k = 0 makes every gate sigmoid(0) = 1/2, and e[n] = n along q reads the count itself: the score of
    (i, j) is p_ij = (keys i sees from j to i) / 2, memory included, clamped at max_position."""
    scheme, (L, M) = new_scheme(COPE, max_position=max_position), (4, 3)
    pos, (_, k, _) = make_positions(L, M, same_length), qkv(L, M)
    q = torch.zeros(B, H, L, DH)
    q[..., 0], k[..., 0] = 1.0, 0.0
    with torch.no_grad():
        scheme.embedding.zero_()
        scheme.embedding[0, :, 0] = torch.arange(max_position + 1.0)
        scores = scheme.scores(0, q, k, pos)
    seen = pos.visible.flip(-1).cumsum(-1).flip(-1)  # keys visible from j to i
    want = (seen / 2).clamp(max=max_position).expand(B, H, L, L + M)
    torch.testing.assert_close(scores[..., pos.visible], want[..., pos.visible])
    assert scores.max() == min(max_position, (M + 1 if same_length else M + L) / 2)


def test_cope_max_position_error_or_clamp():
    """overflow=error refuses, before compute, lengths whose counts could pass max_position; clamp serves them."""
    with pytest.raises(ValueError, match=r"count up to 12 keys.*max_position=8.*at least 12.*overflow=clamp"):
        new_scheme(COPE, max_position=8, overflow="error").validate(segment_len=4, mem_len=8)
    new_scheme(COPE, max_position=8).validate(segment_len=4, mem_len=8)
    for options, match in [
        ({"max_position": 0}, "max_position must be an integer >= 1, got 0"),
        ({"max_position": 8, "overflow": "wrap"}, "overflow must be one of clamp, error, got 'wrap'"),
        ({"max_position": None}, "max_position=None must be sized"),
    ]:
        with pytest.raises(ValueError, match=match):
            make_scheme(COPE, **options)


# --------------------------------------------------------------------------------------------
# What each paper leaves open, pinned
# --------------------------------------------------------------------------------------------


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


@pytest.mark.parametrize("name", [KERPLE_LOG, KERPLE_POWER])
def test_kerple_constraints_are_projections(name):
    """r1, r2 >= 0.01 (power: r2 <= 2) as in the authors' code: an update that leaves the range is undone at the
    next forward, in place, and a graph still waiting for its backward stays valid."""
    scheme, pos = make_scheme(name), make_positions(5, 3)
    with torch.no_grad():
        scheme.r1.fill_(-1.0)
        scheme.r2.fill_(5.0)
    waiting = scheme.score_bias(0, pos).dense(pos).sum()  # projects: r1 = 0.01, r2 = 5 (log) or 2 (power)
    assert (scheme.r1 == 0.01).all() and (scheme.r2 == (2.0 if name == KERPLE_POWER else 5.0)).all()
    scheme.score_bias(1, pos).dense(pos)
    waiting.backward()
    assert scheme.r1.grad[0].abs().sum() > 0 and not scheme.r1.grad[1].any()


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


def test_xpos_stays_finite_and_exact_far_from_the_start():
    """The decay factors are taken about the middle of the span: at positions 10^5 (zeta^{-j/B} alone would be
    0.29^{-195}, past fp32) the scores equal those at 0."""
    scheme, pos, (q, k, v) = make_scheme(XPOS), make_positions(5, 4), qkv(5, 4)
    with torch.no_grad():
        near, far = scheme.attend(0, q, k, v, pos, 0.0), scheme.attend(0, q, k, v, pos.shifted(100_000), 0.0)
    assert torch.isfinite(far).all()
    torch.testing.assert_close(far, near, atol=1e-4, rtol=1e-4)


def test_xpos_decays_with_the_distance_and_is_rope_without_it():
    """With q = k and no content difference, xPos's self-score falls faster with distance than RoPE's by
    exactly zeta^{d/B}; with gamma huge (zeta -> 1) it is RoPE."""
    from tests.schemes import ROPE

    pos, (q, k, v) = make_positions(5, 4), qkv(5, 4)
    rope, flat = make_scheme(ROPE), make_scheme(XPOS, gamma=1e9)
    with torch.no_grad():
        torch.testing.assert_close(flat.attend(0, q, k, v, pos, 0.0), rope.attend(0, q, k, v, pos, 0.0))
    zeta = make_scheme(XPOS).log_zeta.exp()
    assert zeta.min() == pytest.approx(0.4 / 1.4) and zeta.max() < 1


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

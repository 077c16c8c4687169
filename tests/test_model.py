"""MemoryTransformer: recurrence, masking, losses and training, for every positional scheme."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from posenc_lab.model import MemoryTransformer, ModelConfig
from posenc_lab.positional import SCHEME_NAMES, schemes_of_kind
from tests.models import make_model
from tests.schemes import GLOBAL_SINUSOID, LEARNED, ROPE, SHAW, SINUSOID, STICKBREAKING, XL

ALL = SCHEME_NAMES
RELATIVE = schemes_of_kind("relative")
V, B = 23, 2


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def tokens(*shape: int) -> torch.Tensor:
    return torch.randint(V, shape)


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_every_scheme_is_reachable_from_model_config(name):
    assert name in SCHEME_NAMES
    model = make_model(name, mem_len=4)
    assert model.scheme.name == name
    out = model(tokens(B, 5))
    assert out.logits.shape == (B, 5, V) and torch.isfinite(out.logits).all()


def test_unknown_scheme_in_config_lists_valid_names():
    with pytest.raises(ValueError, match="'bogus'") as info:
        MemoryTransformer(ModelConfig(posenc="bogus"))
    assert all(name in str(info.value) for name in ALL)


def test_unknown_scheme_option_in_config_is_named():
    with pytest.raises(ValueError, match="clamp_lenn.*clamp_len"):
        MemoryTransformer(ModelConfig(posenc=XL, posenc_kwargs={"clamp_lenn": 4}))


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"d_model": 32, "n_head": 3}, r"n_head=3.*d_model=32"),
        ({"mem_len": -2}, r"mem_len.*-2"),
        ({"mem_len": 2.5}, r"mem_len.*2\.5"),
        ({"n_layer": 0}, r"n_layer.*0"),
        ({"vocab_size": 1.0}, r"vocab_size.*1\.0"),
        ({"same_length": True, "mem_len": 0}, r"same_length.*mem_len"),
        ({"loss_recent_frac": 0.0}, r"loss_recent_frac.*0\.0"),
        ({"dropout": 1.0}, r"dropout.*1\.0"),
        ({"d_model": 12, "n_head": 4, "posenc": ROPE}, r"head size.*3"),
        ({"posenc": SHAW, "posenc_kwargs": {"K": 0}}, r"K.*got 0"),
    ],
)
def test_bad_config_raises_naming_the_value(cfg, match):
    with pytest.raises(ValueError, match=match):
        MemoryTransformer(ModelConfig(**cfg))


@pytest.mark.parametrize(
    "args, match",
    [
        ((-1,), r"segment_len.*-1"),
        ((0,), r"segment_len.*0"),
        ((4.5,), r"segment_len.*4\.5"),
        ((4, -3), r"mem_len.*-3"),
        ((4, 1.5), r"mem_len.*1\.5"),
        ((4, 0, -7), r"max_offset.*-7"),
    ],
)
def test_validate_lengths_rejects_bad_lengths(args, match):
    with pytest.raises(ValueError, match=match):
        make_model(XL).validate_lengths(*args)


# --------------------------------------------------------------------------------------------
# learned: past its table fails before compute
# --------------------------------------------------------------------------------------------


def test_learned_past_its_table_fails_before_any_compute():
    model = make_model(LEARNED, mem_len=50, posenc_kwargs={"max_positions": 8})
    model.validate_lengths(8, mem_len=50, max_offset=10_000)  # positions reset per segment
    with pytest.raises(ValueError, match=r"position 8\b.*max_positions=8"):
        model.validate_lengths(9)

    ran = []
    model.blocks[0].register_forward_hook(lambda *_: ran.append(1))
    with pytest.raises(ValueError, match=r"position 11\b.*max_positions=8"):
        model(tokens(B, 12))
    assert not ran, "the learned table overflow must be caught before the layers run"


def test_learned_clamp_overflow_works_when_asked():
    model = make_model(LEARNED, posenc_kwargs={"max_positions": 8, "overflow": "clamp"})
    model.validate_lengths(12)
    out = model(tokens(B, 12), tokens(B, 12))
    assert torch.isfinite(out.loss)


# --------------------------------------------------------------------------------------------
# Offsets: only global_sinusoid reads the stream offset
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_only_global_sinusoid_depends_on_the_stream_offset(name):
    model, x = make_model(name, mem_len=5), tokens(B, 6)
    mems = model(tokens(B, 6)).mems
    a = model(x, mems=mems, offset=6).logits
    b = model(x, mems=mems, offset=100).logits
    if name == GLOBAL_SINUSOID:
        assert (a - b).abs().max() > 1e-3
    else:
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_global_sinusoid_offset_is_per_stream():
    model, x = make_model(GLOBAL_SINUSOID), tokens(B, 6)
    both = model(x, offset=torch.tensor([0, 37])).logits
    torch.testing.assert_close(both[0], model(x, offset=0).logits[0])
    torch.testing.assert_close(both[1], model(x, offset=37).logits[1])


@pytest.mark.parametrize("name", RELATIVE + schemes_of_kind("none"))
def test_relative_models_are_shift_invariant(name, monkeypatch):
    """Every position moved by a constant (queries, memory keys, offset): same logits."""
    model = make_model(name, n_layer=2, mem_len=5)
    mems, x = model(tokens(B, 6)).mems, tokens(B, 6)
    base = model(x, mems=mems, offset=6).logits
    positions = model.positions
    monkeypatch.setattr(model, "positions", lambda *a, **k: positions(*a, **k).shifted(13))
    torch.testing.assert_close(model(x, mems=mems, offset=6).logits, base, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# Recurrence
# --------------------------------------------------------------------------------------------


def test_memory_holds_each_layers_last_inputs():
    L, M = 6, 4
    model = make_model(XL, n_layer=2, mem_len=M)
    inputs = []
    model.blocks[1].register_forward_hook(lambda mod, args, out: inputs.append(args[0]))
    x = tokens(B, L)
    out = model(x)
    assert len(out.mems) == 2 and all(m.shape == (B, M, 16) for m in out.mems)
    torch.testing.assert_close(out.mems[0], model.embedding(x[:, -M:]) * model.emb_scale)  # h^0 (xl: no input PE)
    torch.testing.assert_close(out.mems[1], inputs[0][:, -M:])  # the input of layer 1
    # memory grows up to mem_len across segments, newest last
    out2 = model(tokens(B, 2), mems=out.mems)
    torch.testing.assert_close(out2.mems[0][:, :2], out.mems[0][:, -2:])
    # evaluation passes another mem_len to the forward pass, without rebuilding or changing the model
    assert all(m.shape == (B, 7, 16) for m in model(tokens(B, L), mems=out.mems, mem_len=7).mems)
    assert model(tokens(B, L), mems=out.mems, mem_len=0).mems == []
    assert model.mem_len == M and all(m.shape == (B, M, 16) for m in model(tokens(B, L), mems=out.mems).mems)
    with pytest.raises(AttributeError):
        model.mem_len = 7  # read-only: nothing mutates the model from outside


@pytest.mark.parametrize("name", ALL)
def test_memory_is_used(name):
    model, x = make_model(name, mem_len=6), tokens(B, 6)
    mems = model(tokens(B, 6)).mems
    assert (model(x, mems=mems, offset=6).logits - model(x, offset=6).logits).abs().max() > 1e-3


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize(
    "n_layer, L, M, n_seg",
    [
        (1, 6, 6, 2),  # one layer, M == L
        (1, 5, 8, 2),  # one layer, M > L
        (1, 5, 5, 3),  # one layer, M == L, third segment: the window [seg 2 ; seg 3]
        (1, 4, 6, 3),  # one layer, L < M < 2L: memory spans a segment boundary
        (2, 4, 8, 3),  # several layers: holds while M covers everything before
    ],
)
def test_memory_equals_concatenated_run(name, n_layer, L, M, n_seg):
    """With memory, the last segment's outputs equal the last L outputs of one run (no memory) over
    the window the memory covers, with the window's stream offset. Not for absolute-per-segment
    schemes: their memory carries reset positions."""
    model = make_model(name, n_layer=n_layer, mem_len=M)
    stream = tokens(B, n_seg * L)
    mems = None
    for t in range(n_seg):
        out = model(stream[:, t * L : (t + 1) * L], mems=mems, offset=t * L)
        mems = out.mems
    # a 1-layer model looks M tokens back; deeper ones reach everything before here (M covers it)
    start = (n_seg - 1) * L - min(M, (n_seg - 1) * L) if n_layer == 1 else 0
    window = model(stream[:, start:], offset=start, mem_len=0).logits[:, -L:]
    if name in (SINUSOID, LEARNED):
        assert (out.logits - window).abs().max() > 1e-3
    else:
        torch.testing.assert_close(out.logits, window, atol=1e-5, rtol=1e-4)


def test_no_gradient_reaches_the_memory():
    L = 6
    model = make_model(XL, n_layer=2, mem_len=L).train()
    s1, t1, s2, t2 = tokens(B, L), tokens(B, L), tokens(B, L), tokens(B, L)
    out1 = model(s1, t1)
    assert all(not m.requires_grad and m.grad_fn is None for m in out1.mems)
    out2 = model(s2, t2, mems=out1.mems, offset=L)
    assert all(not m.requires_grad and m.grad_fn is None for m in out2.mems)
    out2.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads

    # Segment 2's backward never entered segment 1's graph: it still holds its saved tensors.
    model.zero_grad(set_to_none=True)
    out1.loss.backward()

    # Memory handed in as a leaf that requires grad is stop-gradient all the same (h~ = [SG(mem) ; h]),
    # and the parameter gradients do not change.
    model.zero_grad(set_to_none=True)
    mems = [m.clone().requires_grad_(True) for m in out1.mems]
    model(s2, t2, mems=mems, offset=L).loss.backward()
    assert all(m.grad is None for m in mems)
    for n, p in model.named_parameters():
        if n in grads:
            torch.testing.assert_close(p.grad, grads[n])
        else:
            assert p.grad is None


# --------------------------------------------------------------------------------------------
# Causality and masks
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("with_memory", [False, True])
def test_no_output_depends_on_a_future_token(name, with_memory):
    L = 8
    model = make_model(name, n_layer=2, mem_len=6)
    mems, offset = (model(tokens(B, L)).mems, L) if with_memory else (None, 0)
    x = tokens(B, L)
    base = model(x, mems=mems, offset=offset)
    for t in (0, 3, L - 1):
        changed = x.clone()
        changed[:, t] = (changed[:, t] + 1) % V
        out = model(changed, mems=mems, offset=offset)
        torch.testing.assert_close(out.logits[:, :t], base.logits[:, :t], atol=1e-6, rtol=0)
        assert (out.logits[:, t] - base.logits[:, t]).abs().max() > 1e-4  # the token itself does count
        keep = t - (L - 6)  # the memory slot token t lands in: the states kept before it must not change
        for a, b in zip(out.mems, base.mems):
            torch.testing.assert_close(a[:, : max(keep, 0)], b[:, : max(keep, 0)], atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ALL)
def test_same_length_gives_every_query_mem_len_plus_one_keys(name):
    L, M = 6, 3
    model = make_model(name, n_layer=2, mem_len=M, same_length=True)
    first = model(tokens(B, L), return_attention=True)
    # first segment, no memory yet: query i sees min(i, M) + 1 keys
    own = name != STICKBREAKING  # stick-breaking gives a query's own key no share (attend_current: false)
    seen = (first.attention[0] > 0).sum(-1)
    assert (seen == torch.tensor([min(i, M) + own for i in range(L)])).all()
    out = model(tokens(B, L), mems=first.mems, offset=L, return_attention=True)
    assert model.positions(L, M, torch.zeros(B, dtype=torch.long), torch.device("cpu")).visible.sum(-1).eq(M + 1).all()
    for probs in out.attention:
        assert probs.shape == (B, 2, L, M + L)
        assert ((probs > 0).sum(-1) == M + own).all()
        # the visible keys are exactly j in [i - M, i]
        i, j = torch.arange(L)[:, None], torch.arange(-M, L)[None, :]
        assert (probs[..., ~((j <= i) & (j >= i - M))] == 0).all()


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("same_length", [False, True])
def test_returned_attention_is_a_distribution_over_visible_keys(name, same_length):
    L, M = 5, 7
    model = make_model(name, n_layer=2, mem_len=M, same_length=same_length)
    out = model(tokens(B, L), mems=model(tokens(B, 9)).mems, offset=9, return_attention=True)
    assert len(out.attention) == 2
    visible = model.positions(L, M, torch.zeros(B, dtype=torch.long), torch.device("cpu")).visible
    for probs in out.attention:
        assert probs.shape == (B, 2, L, M + L) and not probs.requires_grad
        assert (probs[..., ~visible] == 0).all()
        if name == STICKBREAKING:  # weights, not a distribution: the stick left over is on no key, nor on its own
            own = torch.arange(L)[:, None] + M == torch.arange(M + L)[None, :]
            assert (probs.sum(-1) < 1).all() and (probs[..., own] == 0).all() and (probs[..., visible & ~own] > 0).all()
            continue
        torch.testing.assert_close(probs.sum(-1), torch.ones(B, 2, L))
        assert (probs[..., visible] > 0).all()
    assert model(tokens(B, L)).attention is None


# --------------------------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------------------------


def test_token_loss_is_the_per_token_nll():
    model, x, y = make_model(XL), tokens(B, 8), tokens(B, 8)
    out = model(x, y)
    expected = F.cross_entropy(out.logits.reshape(-1, V), y.reshape(-1), reduction="none").view(B, 8)
    torch.testing.assert_close(out.token_loss, expected)
    torch.testing.assert_close(out.loss, expected.mean())
    assert model(x).loss is None


def test_half_loss_is_the_mean_of_the_last_half():
    L = 16
    model, x, y = make_model(SINUSOID, loss_recent_frac=0.5), tokens(B, L), tokens(B, L)
    out = model(x, y)
    torch.testing.assert_close(out.loss, out.token_loss[:, L // 2 :].mean())
    assert not torch.allclose(out.loss, out.token_loss.mean())
    # the cut does not change the per-token losses themselves
    model.cfg.loss_recent_frac = 1.0
    full = model(x, y)
    torch.testing.assert_close(full.token_loss, out.token_loss)
    torch.testing.assert_close(full.loss, out.token_loss.mean())


@pytest.mark.parametrize("frac", [1.0, 0.5])
def test_loss_mask_is_honoured(frac):
    L = 16
    model, x, y = make_model(XL, loss_recent_frac=frac), tokens(B, L), tokens(B, L)
    mask = torch.rand(B, L) < 0.5
    mask[:, -1] = True
    recent = torch.arange(L) >= L - int(frac * L)
    out = model(x, y, loss_mask=mask)
    torch.testing.assert_close(out.loss, out.token_loss[mask & recent].mean())
    # the counted tokens come back with the output (LitLM's DDP normalisation counts these, no second cut)
    assert torch.equal(out.counted, mask & recent) and torch.equal(model.scored(mask), mask & recent)
    # nothing outside the mask matters: changing those targets leaves the loss unchanged
    y2 = torch.where(mask, y, (y + 1) % V)
    torch.testing.assert_close(model(x, y2, loss_mask=mask).loss, out.loss)


# --------------------------------------------------------------------------------------------
# Precision and training
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_bf16_autocast_with_memory_matches_fp32(name):
    L = 8
    model = make_model(name, n_layer=2, mem_len=L)
    s1, s2, y = tokens(B, L), tokens(B, L), tokens(B, L)

    def run():
        mems = model(s1, y).mems
        return model(s2, y, mems=mems, offset=L).loss

    reference = run()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = run()
    assert torch.isfinite(loss)
    assert abs(loss.item() - reference.item()) < 0.05 * reference.item()
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("mem_len", [0, 16])
def test_every_scheme_learns_a_repeated_pattern(name, mem_len):
    vocab, L, batch, period = 16, 16, 8, 12
    pattern = torch.randint(vocab, (period,))
    model = make_model(
        name, n_layer=2, mem_len=mem_len, randomize=False, vocab_size=vocab, d_model=32, n_head=4, d_inner=64
    )
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mems, losses = None, []
    for step in range(60):
        if not mem_len or step % 4 == 0:  # a new episode (with memory: 4 segments long): fresh phase, no memory
            phase, seg, mems = torch.randint(period, (batch, 1)), 0, None
        window = pattern[(phase + seg * L + torch.arange(L + 1)) % period]
        out = model(window[:, :-1], window[:, 1:], mems=mems, offset=seg * L)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        mems, seg = out.mems, seg + 1
        losses.append(out.loss.item())
    assert min(losses[-5:]) < 0.5 * math.log(vocab), losses


# --------------------------------------------------------------------------------------------
# The memory takes no gradient
# --------------------------------------------------------------------------------------------


class MatmulShapes(torch.utils._python_dispatch.TorchDispatchMode):
    """The output shapes of every matrix product (mm, addmm) run under it."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm):
            self.shapes.append(tuple(out.shape))
        return out


@pytest.mark.parametrize("pre_norm", [True, False])
@pytest.mark.parametrize("name", [XL, ROPE])
def test_backward_computes_no_gradient_for_the_memory_and_equals_projecting_the_whole_context(name, pre_norm):
    """The memory is stop-gradient: no GEMM of the backward yields a gradient for its rows (before, k and v's
    projection gave one for all M + L keys, [B (M + L), D], and dropped the memory's part). The block's output and
    every gradient equal those of projecting [memory ; segment] as one (the published formulation)."""
    L, M, D = 3, 4, 16  # B (M + L) = 14 and B M = 8: no other product of the backward has 14 or 8 rows of D columns
    # every parameter drawn: LayerNorm's gain and bias away from 1 and 0, where moving them into W would show
    model = make_model(name, mem_len=M, randomize="all", pre_norm=pre_norm, d_model=D, n_head=2, d_inner=24)
    model(tokens(B, M))  # fill the memory
    out = model(tokens(B, M))
    memory = out.mems
    block, x = model.blocks[0], torch.randn(B, L, D, requires_grad=True)
    context = torch.cat([memory[0], x], dim=1)
    pos = model.positions(L, M, torch.zeros(B, dtype=torch.long), x.device)
    y = block(x, context, model.scheme, 0, pos)
    with MatmulShapes() as seen:  # the backward's products
        grads = torch.autograd.grad(y.square().sum(), [x, *block.parameters()])
    assert not {s for s in seen.shapes if s in ((B * (M + L), D), (B * M, D))}, seen.shapes
    if pre_norm:  # the previous formulation: one LayerNorm and one projection over [memory ; segment]
        normed = block.ln_attn(context)
        whole = x + block.drop(block.attention(normed[:, M:], normed, model.scheme, 0, pos, None))
        whole = whole + block.drop(block.ff(block.ln_ff(whole)))
    else:
        whole = block.ln_attn(x + block.drop(block.attention(x, context, model.scheme, 0, pos, None)))
        whole = block.ln_ff(whole + block.drop(block.ff(whole)))
    torch.testing.assert_close(y, whole, atol=1e-5, rtol=1e-5)
    expect = torch.autograd.grad(whole.square().sum(), [x, *block.parameters()])
    for got, want in zip(grads, expect, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)  # fp32: (xhat gamma) W^T = xhat (W gamma)^T

"""Scalable softmax (``model.softmax_scale=ssmax``, posenc_lab/softmax_scale.py): every softmax scheme's attention
against a naive per-row reference, softmax_j(s_h log(n_i) z_ij) with z_ij its own logits, forward and backward, on
both attention paths; the bias scaled with the rest of the logit; n_i counting the keys a query sees (memory, the
window, a static memory's valid slots); memory equal to one long pass; refused with its reason where the attention is
no softmax; and a few training steps through the entry point."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_lab.model import ModelConfig
from posenc_lab.positional import SCHEME_NAMES, SCHEMES, AttentionInputs
from posenc_lab.positional.base import Softmax
from posenc_lab.softmax_scale import SSMAX_INIT, SSMax
from tests.models import make_model, memory_and_window
from tests.positional.test_fused import reference  # noqa: F401 - a fixture: flex_attention uncompiled on CPU
from tests.positional.test_schemes import B, D, H, make_positions, make_scheme, masked_softmax, qkv
from tests.schemes import (
    ALIBI,
    COPE,
    FIRE,
    FOX,
    KERPLE_LOG,
    KERPLE_POWER,
    PATH,
    ROPE,
    SANDWICH,
    SHAW,
    STICKBREAKING,
    T5,
    XL,
)
from tests.test_memory import _run_both

SOFTMAX = tuple(name for name in SCHEME_NAMES if SCHEMES[name].softmax_refused is None)
FUSED = (ALIBI, T5, KERPLE_LOG, KERPLE_POWER, SANDWICH, FIRE, FOX, XL, SHAW)  # the schemes with a flex path
# (L, M, same_length): no memory, M < L, M > L, the same-length window
CASES = [(5, 0, False), (5, 3, False), (4, 9, False), (5, 3, True)]
S = torch.tensor([0.9, -0.4, SSMAX_INIT, 0.0])  # s_h of the H = 4 heads: a negative one and a zero one too


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def scale_of(s: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """[H, L, 1] s_h log n_i, n_i counted here from the mask's rows."""
    return s[:, None, None] * torch.log(visible.sum(-1).double()).float()[None, :, None]


def naive_ssmax(plain: torch.Tensor, scale: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Row by row: softmax over the visible keys of lambda_i z_ij, with z_ij = log p_ij + c_i read from the plain
    probabilities (c_i, constant along the row, cancels in the softmax). [B, H, L, N]."""
    out = torch.zeros_like(plain)
    for i in range(visible.shape[0]):
        seen = visible[i]
        out[:, :, i, seen] = torch.softmax(plain[:, :, i, seen].log() * scale[None, :, i], dim=-1)
    return out


def naive_output(name, scheme, probs, v, pos, layer):
    """sum_j p_ij v_j, and Shaw's value term sum_j p_ij a^V_{clip(j-i)} per pair."""
    out = probs @ v
    if name == SHAW:
        rows = scheme.a_value[layer][scheme.buckets(pos)]  # [L, N, d_h]
        out = out + torch.einsum("bhln,lnd->bhld", probs, rows)
    return out


def check(name, L, M, same_length, impl):
    """attention_probs and attend with the logit scale against the naive reference: values and the gradients of q,
    k, v, the layer input and s."""
    layer = 1
    scheme = make_scheme(name)
    scheme.attention_impl = impl
    pos = make_positions(L, M, same_length)
    q, k, v = qkv(L, M)
    x = torch.randn(B, M + L, D)
    got_in, want_in = ([t.clone().requires_grad_() for t in (q, k, v, x, S)] for _ in range(2))
    gq, gk, gv, gx, gs = got_in
    probs = scheme.attention_probs(
        AttentionInputs(layer, gq, gk, pos, context=gx, softmax=Softmax(scale_of(gs, pos.visible)))
    )
    out = scheme.attend(
        AttentionInputs(layer, gq, gk, pos, v=gv, context=gx, softmax=Softmax(scale_of(gs, pos.visible)))
    )
    wq, wk, wv, wx, ws = want_in
    plain = scheme.attention_probs(AttentionInputs(layer, wq, wk, pos, context=wx))
    want_probs = naive_ssmax(plain, scale_of(ws, pos.visible), pos.visible)
    want_out = naive_output(name, scheme, want_probs, wv, pos, layer)
    torch.testing.assert_close(probs, want_probs, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-4)
    assert (want_probs - plain).abs().max() > 1e-3  # not vacuous: the scale changes the attention
    wp, wo = torch.randn_like(probs), torch.randn_like(out)
    got_grads = torch.autograd.grad((probs * wp).sum() + (out * wo).sum(), got_in, allow_unused=True)
    want_grads = torch.autograd.grad((want_probs * wp).sum() + (want_out * wo).sum(), want_in, allow_unused=True)
    for which, a, b in zip("qkvxs", got_grads, want_grads):
        if a is None or b is None:  # the layer input reaches only the data-dependent schemes
            assert a is None and b is None and which == "x", (name, which)
            continue
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=f"{name}: gradient of {which}")


@pytest.mark.parametrize("L, M, same_length", CASES)
@pytest.mark.parametrize("name", SOFTMAX)
def test_every_softmax_scheme_equals_the_naive_ssmax_forward_and_backward(name, L, M, same_length):
    """The unfused path (SDPA, or the scheme's own attention). Every registered scheme that does not declare
    ``softmax_refused`` is here: one added later that ignores ``AttentionInputs.softmax`` fails this."""
    check(name, L, M, same_length, "unfused")


@pytest.mark.parametrize("L, M, same_length", CASES)
@pytest.mark.parametrize("name", FUSED)
@pytest.mark.usefixtures("reference")
def test_the_fused_path_equals_the_naive_ssmax_forward_and_backward(name, L, M, same_length):
    """flex_attention's score_mod times lambda_hi (bias schemes), and xl's and Shaw's own flex paths."""
    check(name, L, M, same_length, "fused")


def test_the_whole_logit_is_scaled_the_bias_included():
    """ALiBi per pair: softmax(lambda_i (q_i . k_j / sqrt(d_h) - m_h (i - j))), not lambda_i q_i . k_j - m_h (i - j)."""
    scheme, pos, (q, k, _) = make_scheme(ALIBI), make_positions(5, 3), qkv(5, 3)
    scale = scale_of(S.abs() + 0.5, pos.visible)
    content = torch.zeros(B, H, 5, 8)
    bias = torch.zeros(H, 5, 8)
    for i in range(5):
        for j in range(8):
            content[:, :, i, j] = (q[:, :, i] * k[:, :, j]).sum(-1) / math.sqrt(q.shape[-1])
            bias[:, i, j] = -scheme.slopes * float(pos.q[i] - pos.k[j])
    with torch.no_grad():
        got = scheme.attention_probs(AttentionInputs(0, q, k, pos, softmax=Softmax(scale)))
    torch.testing.assert_close(got, masked_softmax(scale * (content + bias), pos.visible), atol=1e-6, rtol=1e-5)
    assert (got - masked_softmax(scale * content + bias, pos.visible)).abs().max() > 1e-3


def test_n_counts_the_keys_a_query_sees():
    """Memory keys included, the same-length window and a static memory's invalid slots excluded."""
    ssmax = SSMax(H)
    with torch.no_grad():
        ssmax.s.copy_(S)
    causal = make_positions(3, 4)  # query i sees M + i + 1 = 5, 6, 7 keys
    window = make_positions(3, 4, same_length=True)  # M + 1 = 5 each
    static = make_positions(3, 4)
    static.valid = torch.arange(7) >= 2  # 2 of the 4 slots not valid yet: 3, 4, 5
    static.visible = static.visible & static.valid[None, :]
    for pos, n in ((causal, [5, 6, 7]), (window, [5, 5, 5]), (static, [3, 4, 5])):
        torch.testing.assert_close(ssmax(pos), S[:, None, None] * torch.tensor(n).float().log()[None, :, None])


def test_s_starts_where_s_log_n_averages_one_over_the_papers_context():
    """SSMAX_INIT = 1 / mean_{n <= 1024} ln n (the paper trains at 1024 tokens); one s per head in every layer."""
    assert SSMAX_INIT == pytest.approx(1 / (sum(math.log(n) for n in range(1, 1025)) / 1024), abs=1e-3)
    model = make_model(ROPE, n_layer=3, randomize=None, softmax_scale="ssmax")
    assert [tuple(b.ssmax.s.shape) for b in model.blocks] == [(2,)] * 3
    assert all(torch.all(b.ssmax.s == SSMAX_INIT) for b in model.blocks)
    assert make_model(ROPE, randomize=None).blocks[0].ssmax is None


@pytest.mark.parametrize("name", [ROPE, ALIBI, XL, COPE, FOX, PATH])
def test_with_memory_equals_one_long_pass(name):
    """One layer, M = 8 > L = 4: the last segment with memory scores as the same tokens at the end of one pass over
    the window (each query sees M + i + 1 keys in both); s reaches a gradient; and the scale changes the logits."""
    L, M = 4, 8
    model = make_model(name, n_layer=1, mem_len=M, randomize="all", softmax_scale="ssmax")
    stream = torch.randint(0, 23, (B, 3 * L))
    out, window = memory_and_window(model, stream, L)
    torch.testing.assert_close(out.logits, window.logits[:, -L:], atol=1e-5, rtol=1e-4)
    window.logits.square().mean().backward()
    assert model.blocks[0].ssmax.s.grad.abs().min() > 0
    plain = make_model(name, n_layer=1, mem_len=M, randomize="all")
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "ssmax" not in k})
    assert (plain(stream, mem_len=0).logits - window.logits).abs().max() > 1e-3


@pytest.mark.parametrize("name", [ROPE, ALIBI, XL, SHAW])
def test_a_static_memory_counts_only_its_valid_slots(name):
    """From a stream's empty start (0, 3, 6, 8 valid slots) and after a reset: the static memory scores as the
    growing list of exactly the valid states, so n_i counts no empty slot."""
    model = make_model(name, n_layer=2, mem_len=8, randomize="all", softmax_scale="ssmax")
    static, growing = _run_both(model, False, reset_at=4)
    for t, ((a, _), (b, _)) in enumerate(zip(static, growing)):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5, msg=f"{name} segment {t}")


def test_a_scheme_whose_attention_is_no_softmax_refuses_it_and_bad_values_are_named():
    with pytest.raises(ValueError) as refused:
        ModelConfig(posenc=STICKBREAKING, softmax_scale="ssmax")
    assert str(refused.value).startswith("model.softmax_scale=ssmax does not apply to posenc=stickbreaking: its ")
    assert "no softmax" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(ValueError, match=r"^model.softmax_scale must be null \(the plain softmax\) or one of ssmax, "):
        ModelConfig(softmax_scale="ssmx")
    assert STICKBREAKING not in SOFTMAX and len(SOFTMAX) == len(SCHEME_NAMES) - 1


def test_a_hybrid_takes_it_unless_a_layer_refuses_it_or_a_window_would_miscount_n():
    """A hybrid passes the scale to its layers' schemes: refused where one of them refuses it (stick-breaking), and
    with windows, where n_i (the model's visible keys) is not the keys a windowed layer sees."""
    ModelConfig(posenc="hybrid", posenc_kwargs={"layers": ["rope", "nope"]}, softmax_scale="ssmax")
    with pytest.raises(ValueError, match=r"^model.softmax_scale=ssmax does not apply to posenc=stickbreaking: "):
        ModelConfig(posenc="hybrid", posenc_kwargs={"layers": ["rope", "stickbreaking"]}, softmax_scale="ssmax")
    with pytest.raises(ValueError, match=r"^model.softmax_scale=ssmax does not apply to a hybrid with windows"):
        ModelConfig(
            posenc="hybrid",
            posenc_kwargs={"layers": ["rope", "nope"], "windows": {"rope": 8}},
            softmax_scale="ssmax",
        )


def test_a_few_training_steps_through_the_entry_point(tmp_path):
    """conf/model/default.yaml's softmax_scale reaches every block; the trained s moved and is in the checkpoint."""
    from posenc_lab.train import train
    from tests.helpers_train import compose_config, tiny

    overrides = tiny(tmp_path / "run", tmp_path / "cache", f"posenc={ALIBI}", "model.softmax_scale=ssmax", steps=3)
    results = train(compose_config("train", overrides))
    state = torch.load(results["checkpoint"], weights_only=False)["state_dict"]
    s = [v for key, v in state.items() if key.endswith("ssmax.s")]
    assert s and all(torch.isfinite(t).all() and (t != SSMAX_INIT).any() for t in s)

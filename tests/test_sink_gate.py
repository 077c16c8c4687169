"""A learned attention sink (``model.attention_sink``) and an output gate (``model.output_gate``),
posenc_lab/sink_gate.py: every softmax scheme's attention with a sink against what a sink must do (each row's
output and probabilities scaled by the one share the sink leaves, logistic in its logit), and against gpt-oss's
formula (the sink as one more column of the logits, softmax, the column dropped) where the logits can be written
out, forward and backward, with memory; memory equal to one long pass and a static memory equal to the growing one;
the gate equal to its formula; refusals named; and a few training steps through the entry point."""

from __future__ import annotations

import pytest
import torch

from posenc_lab.model import ModelConfig
from posenc_lab.positional import SCHEME_NAMES, SCHEMES, AttentionInputs
from posenc_lab.positional.base import PLAIN, Softmax, mask_to_bias
from tests.models import make_model, memory_and_window
from tests.positional.test_schemes import B, D, make_positions, make_scheme, qkv
from tests.schemes import ALIBI, COPE, FOX, HYBRID, PATH, ROPE, SHAW, STICKBREAKING, XL
from tests.test_memory import _run_both
from tests.test_softmax_scale import CASES, naive_output

SOFTMAX = tuple(name for name in SCHEME_NAMES if SCHEMES[name].softmax_refused is None)
SINK = torch.tensor([0.7, -1.2, 0.0, 2.0])  # s_h of the H = 4 heads


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def attend_with(name, L, M, same_length, *sinks):
    """[(probs, out)] of scheme ``name`` on one draw of inputs (layer 1): no sink, then each of ``sinks``."""
    scheme, pos = make_scheme(name), make_positions(L, M, same_length)
    q, k, v = qkv(L, M)
    x = torch.randn(B, M + L, D)
    out = []
    for softmax in [PLAIN, *(Softmax(sink=s) for s in sinks)]:
        out.append(
            (
                scheme.attention_probs(AttentionInputs(1, q, k, pos, context=x, softmax=softmax)),
                scheme.attend(AttentionInputs(1, q, k, pos, v=v, context=x, softmax=softmax)),
            )
        )
    return out


@pytest.mark.parametrize("L, M, same_length", CASES)
@pytest.mark.parametrize("name", SOFTMAX)
def test_a_sink_scales_each_row_by_the_share_it_leaves(name, L, M, same_length):
    """With a sink, row i's probabilities and output are the plain ones times one r_i in (0, 1) (the sink's value
    is zero, so what it takes goes nowhere; Shaw's value term included), and r = 1 / (1 + exp(s_h - A_i)): moving s
    by delta moves logit(r) by -delta exactly. Every softmax scheme, with memory and the same-length window."""
    (p0, o0), (p1, o1), (p2, o2) = attend_with(name, L, M, same_length, SINK, SINK + 1.5)
    r1, r2 = p1.sum(-1) / p0.sum(-1), p2.sum(-1) / p0.sum(-1)  # [B, H, L]
    assert ((r1 > 0) & (r1 < 1)).all() and (r2 < r1).all()
    torch.testing.assert_close(p1, r1[..., None] * p0, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(o1, r1[..., None] * o0, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(o2, r2[..., None] * o0, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.logit(r1.double()) - torch.logit(r2.double()), torch.full_like(r1, 1.5).double(),
                               atol=1e-3, rtol=1e-3)  # fmt: skip


def logits(name, scheme, q, k, pos):
    """[B, H, L, N] the scheme's scaled logits, -inf where not visible, written out as each scheme defines them."""
    if name in (XL, SHAW):
        return scheme.scores(1, q, k, pos)
    q, k = scheme.rotate(1, q, k, pos)
    z = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + mask_to_bias(pos.visible, q.dtype)
    bias = scheme._bias(1, pos, None)
    return z if bias is None else z + bias.dense(pos)


def gpt_oss_probs(z, sink):
    """gpt-oss's eager attention: the sink a column of the logits, the softmax over both, the column dropped."""
    sinks = sink[None, :, None, None].expand(*z.shape[:-1], 1)
    combined = torch.cat([z, sinks], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    return torch.softmax(combined, dim=-1)[..., :-1]


@pytest.mark.parametrize("L, M, same_length", CASES)
@pytest.mark.parametrize("name", [ROPE, ALIBI, XL, SHAW])
def test_the_sink_equals_gpt_oss_formula_forward_and_backward(name, L, M, same_length):
    """Where the logits can be written out (SDPA's rotate and bias, xl's and Shaw's scores): probabilities and output
    against gpt-oss's formula, and the gradients of q, k, v and the sink's logits."""
    scheme, pos = make_scheme(name), make_positions(L, M, same_length)
    inputs = [*qkv(L, M), SINK]
    got_in, want_in = ([t.clone().requires_grad_() for t in inputs] for _ in range(2))
    gq, gk, gv, gs = got_in
    probs = scheme.attention_probs(AttentionInputs(1, gq, gk, pos, softmax=Softmax(sink=gs)))
    out = scheme.attend(AttentionInputs(1, gq, gk, pos, v=gv, softmax=Softmax(sink=gs)))
    wq, wk, wv, ws = want_in
    want_probs = gpt_oss_probs(logits(name, scheme, wq, wk, pos), ws)
    want_out = naive_output(name, scheme, want_probs, wv, pos, 1)
    torch.testing.assert_close(probs, want_probs, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-4)
    wp, wo = torch.randn_like(probs), torch.randn_like(out)
    got = torch.autograd.grad((probs * wp).sum() + (out * wo).sum(), got_in)
    want = torch.autograd.grad((want_probs * wp).sum() + (want_out * wo).sum(), want_in)
    for which, a, b in zip("qkvs", got, want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=f"{name}: gradient of {which}")
    assert got[3].abs().min() > 0


@pytest.mark.parametrize("options", [{"attention_sink": True}, {"output_gate": True}], ids=["sink", "gate"])
@pytest.mark.parametrize("name", [ROPE, ALIBI, XL, COPE, FOX, PATH])
def test_with_memory_equals_one_long_pass(name, options):
    """One layer, M = 8 > L = 4: the last segment with memory scores as the same tokens at the end of one pass (the
    sink is one key however many the memory adds; the gate reads the queries' own input); the new parameters reach
    a gradient and change the logits."""
    L, M = 4, 8
    model = make_model(name, n_layer=1, mem_len=M, randomize="all", **options)
    stream = torch.randint(0, 23, (B, 3 * L))
    out, window = memory_and_window(model, stream, L)
    torch.testing.assert_close(out.logits, window.logits[:, -L:], atol=1e-5, rtol=1e-4)
    window.logits.square().mean().backward()
    new = [p for n, p in model.named_parameters() if ".sink." in n or ".gate." in n]
    assert new and all(p.grad.abs().max() > 0 for p in new)
    plain = make_model(name, n_layer=1, mem_len=M, randomize="all")
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if k in plain.state_dict()})
    assert (plain(stream, mem_len=0).logits - window.logits).abs().max() > 1e-3


@pytest.mark.parametrize("options", [{"attention_sink": True, "softmax_scale": "ssmax"}, {"output_gate": True}])
@pytest.mark.parametrize("name", [ROPE, XL, SHAW])
def test_a_static_memory_scores_as_the_growing_memory(name, options):
    """From a stream's empty start and after a reset: the sink sees no empty slot's share (the slots are masked)."""
    model = make_model(name, n_layer=2, mem_len=8, randomize="all", **options)
    static, growing = _run_both(model, False, reset_at=4)
    for t, ((a, _), (b, _)) in enumerate(zip(static, growing)):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5, msg=f"{name} segment {t}")


def test_the_gate_multiplies_each_heads_output_by_sigmoid_of_the_layers_input():
    """Block.attention with the gate equals out_proj(o * sigmoid(x W_g)), o the attention without it, per channel."""
    gated = make_model(ROPE, n_layer=1, randomize="all", output_gate=True)
    plain = make_model(ROPE, n_layer=1, randomize="all")
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if k in plain.state_dict()})
    block, other = gated.blocks[0], plain.blocks[0]
    x = torch.randn(B, 5, 16)
    pos = gated.positions(5, 0, torch.zeros(B, dtype=torch.long), x.device)
    seen = []
    other.out_proj.register_forward_hook(lambda m, inp, out: seen.append(inp[0]))
    other.attention(x, x, plain.scheme, 0, pos, None)
    want = torch.nn.functional.linear(seen[0] * torch.sigmoid(x @ block.gate.proj.weight.T), block.out_proj.weight)
    torch.testing.assert_close(block.attention(x, x, gated.scheme, 0, pos, None), want, atol=1e-6, rtol=1e-5)


def test_refused_where_the_attention_is_no_softmax_and_bad_values_named():
    with pytest.raises(ValueError) as refused:
        ModelConfig(posenc=STICKBREAKING, attention_sink=True)
    text = str(refused.value)
    assert text.startswith("model.attention_sink=true does not apply to posenc=stickbreaking: its attention is no")
    assert text.endswith("(set model.attention_sink=false)") and "\n" not in text
    with pytest.raises(ValueError, match=r"^model.attention_sink=true does not apply to posenc=stickbreaking: "):
        ModelConfig(posenc=HYBRID, posenc_kwargs={"layers": [ROPE, STICKBREAKING]}, attention_sink=True)
    with pytest.raises(ValueError, match=r"^model.attention_sink must be true or false, got 'yes'$"):
        ModelConfig(attention_sink="yes")
    with pytest.raises(ValueError, match=r"^model.output_gate must be true or false, got 1$"):
        ModelConfig(output_gate=1)
    ModelConfig(posenc=STICKBREAKING, output_gate=True)  # the gate reads no softmax: it applies


def test_a_few_training_steps_through_the_entry_point(tmp_path):
    """conf/model/default.yaml's options reach every block; the sink's logits moved from 0 and the gate's weights are
    in the checkpoint."""
    from posenc_lab.train import train
    from tests.helpers_train import compose_config, tiny

    overrides = tiny(tmp_path / "run", tmp_path / "cache", f"posenc={ROPE}", "model.attention_sink=true",
                     "model.output_gate=true", steps=3)  # fmt: skip
    results = train(compose_config("train", overrides))
    state = torch.load(results["checkpoint"], weights_only=False)["state_dict"]
    sinks = [v for key, v in state.items() if key.endswith("sink.logit")]
    gates = [v for key, v in state.items() if key.endswith("gate.proj.weight")]
    assert (
        sinks
        and len(gates) == len(sinks)
        and all(t.dim() == 1 and g.shape[0] == g.shape[1] for t, g in zip(sinks, gates))
    )
    assert all(torch.isfinite(t).all() and (t != 0).any() for t in sinks)

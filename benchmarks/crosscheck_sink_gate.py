"""Side by side, run by hand (no project code imports it, no dependency of the project): posenc-lab's learned
attention sink against gpt-oss's eager attention in Hugging Face transformers (``modeling_gpt_oss.
eager_attention_forward``, which reads ``module.sinks``), and its output gate against Qwen3-Next's gated attention
(``modeling_qwen3_next.Qwen3NextAttention``), forward and gradients, with memory.

    pip install torch==2.13.0 transformers       # into a venv of your own, not the project's
    PYTHONPATH=. python benchmarks/crosscheck_sink_gate.py

The conventions that differ, and how each side is put on the other's:
- gpt-oss's function takes rotated q and k and an additive mask; ours rotates inside the scheme. Ours are handed
  to it rotated (rope), and a scheme whose logit is more than q . k (alibi's bias, xl's position terms) hands it
  the rest inside the mask: the mask is the scheme's logits minus q . k / sqrt(d_h). Memory keys are keys.
- Qwen3-Next projects the gate with the queries (one q_proj, each head's query and gate side by side) and
  normalises q and k per head (q_norm, k_norm); ours has its own W_g and no such norm. The norms are replaced by the
  identity and the rotation by none (posenc=nope), q_proj is built from our W_q and W_g head by head. Their layer
  has no memory: it is given [memory ; segment] as its input with a causal mask and its last L rows are compared.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import Qwen3NextConfig
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention

from posenc_lab.model import MemoryTransformer, ModelConfig
from posenc_lab.positional import AttentionInputs
from posenc_lab.positional.base import Softmax, mask_to_bias

torch.manual_seed(0)
B, H, D, L, M = 2, 4, 32, 6, 5
d_h = D // H


def gpt_oss_sinks() -> float:
    """The largest difference, output and gradients, over rope, alibi and xl with M memory keys."""
    worst = 0.0
    for name in ("rope", "alibi", "xl"):
        model = MemoryTransformer(ModelConfig(posenc=name, n_layer=2, d_model=D, n_head=H, mem_len=M))
        scheme = model.scheme.eval()
        for p in scheme.parameters():
            nn.init.normal_(p, 0, 0.5)
        pos = model.positions(L, M, torch.zeros(B, dtype=torch.long), torch.device("cpu"))
        q, k, v = torch.randn(B, H, L, d_h), torch.randn(B, H, M + L, d_h), torch.randn(B, H, M + L, d_h)
        sinks = torch.randn(H)
        ours_in = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
        theirs_in = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
        oq, ok, ov, os_ = ours_in
        ours = scheme.attend(AttentionInputs(1, oq, ok, pos, v=ov, softmax=Softmax(sink=os_)))
        tq, tk, tv, ts = theirs_in
        if name == "xl":  # its logits: scores(); the rest beyond q . k goes in the mask
            logits = scheme.scores(1, tq, tk, pos)
            rq, rk = tq, tk
        else:
            rq, rk = scheme.rotate(1, tq, tk, pos)
            logits = rq @ rk.transpose(-1, -2) * d_h**-0.5 + mask_to_bias(pos.visible, q.dtype)
            bias = scheme._bias(1, pos, None)
            logits = logits if bias is None else logits + bias.dense(pos)
        mask = logits - rq @ rk.transpose(-1, -2) * d_h**-0.5
        module = nn.Module()
        module.sinks, module.num_key_value_groups, module.training = ts, 1, False
        theirs = eager_attention_forward(module, rq, rk, tv, mask, scaling=d_h**-0.5)[0].transpose(1, 2)
        w = torch.randn_like(ours)
        grads = zip(torch.autograd.grad((ours * w).sum(), ours_in), torch.autograd.grad((theirs * w).sum(), theirs_in))
        diffs = [(ours - theirs).abs().max().item(), *((a - b).abs().max().item() for a, b in grads)]
        worst_here = max(diffs)
        print(
            f"sink, {name} with {M} memory keys: output and gradients of q, k, v, sinks differ by at most "
            f"{worst_here:.2e}"
        )
        worst = max(worst, *diffs)
    return worst


def qwen3_next_gate() -> float:
    """Our Block's attention with the gate (posenc=nope, memory M) against Qwen3NextAttention on [memory ; segment]."""
    model = MemoryTransformer(ModelConfig(posenc="nope", n_layer=1, d_model=D, n_head=H, mem_len=M, output_gate=True))
    block = model.blocks[0]
    for p in block.parameters():
        nn.init.normal_(p, 0, 0.3)
    config = Qwen3NextConfig(
        hidden_size=D, num_attention_heads=H, num_key_value_heads=H, head_dim=d_h, attention_bias=False
    )
    config._attn_implementation = "eager"
    theirs = Qwen3NextAttention(config, layer_idx=0).eval()
    theirs.q_norm, theirs.k_norm = nn.Identity(), nn.Identity()
    with torch.no_grad():  # q_proj: head h's query rows, then its gate rows
        Wq, Wg = block.q_proj.weight.view(H, d_h, D), block.gate.proj.weight.view(H, d_h, D)
        theirs.q_proj.weight.copy_(torch.cat([Wq, Wg], dim=1).reshape(2 * D, D))
        theirs.k_proj.weight.copy_(block.kv_proj.weight[:D])
        theirs.v_proj.weight.copy_(block.kv_proj.weight[D:])
        theirs.o_proj.weight.copy_(block.out_proj.weight)
    context = torch.randn(B, M + L, D, requires_grad=True)  # the layer's (normed) input over [memory ; segment]
    pos = model.positions(L, M, torch.zeros(B, dtype=torch.long), torch.device("cpu"))
    ours = block.attention(context[:, M:], context, model.scheme, 0, pos, None)
    causal = mask_to_bias(torch.ones(M + L, M + L, dtype=torch.bool).tril(), context.dtype)[None, None]
    no_rotation = (torch.ones(B, M + L, d_h), torch.zeros(B, M + L, d_h))
    out = theirs(context, no_rotation, causal)[0][:, M:]
    w = torch.randn_like(ours)
    (g_ours,) = torch.autograd.grad((ours * w).sum(), context)
    (g_theirs,) = torch.autograd.grad((out * w).sum(), context)
    diffs = [(ours - out).abs().max().item(), (g_ours - g_theirs).abs().max().item()]
    print(f"gate, with {M} memory keys: output and the input's gradient differ by at most {max(diffs):.2e}")
    return max(diffs)


if __name__ == "__main__":
    import transformers

    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    worst = max(gpt_oss_sinks(), qwen3_next_gate())
    print("agree" if worst < 1e-5 else "DIFFER", f"(largest difference {worst:.2e})")

"""posenc-lab's pope against x-transformers' PolarEmbedding, side by side (not project code, not a dependency).

    pip install x-transformers        # into a scratch venv; this run: x-transformers 2.x (printed below)
    python benchmarks/crosscheck_pope.py

x-transformers' own pieces run unchanged: ``PolarEmbedding`` (frequencies, the learned phase, its clamp),
``apply_polar_pos_emb`` (softplus, the [mu cos ; mu sin] layout) and ``Attend`` (scale and causal softmax) with the
scale its ``Attention`` passes (``dim_head ** -0.5``). Its phase is set to ours. Ours runs a segment of L queries
over M memory keys (positions -M..L-1); theirs one causal pass over the M + L tokens (positions 0..M+L-1), of which
the last L rows are compared: forward, and the gradients of q, k, v and the phase. Last, x-transformers' Decoder
with polar_pos_emb and ``mems`` (its Transformer-XL memory) is run, to see whether it serves memory.
"""

from __future__ import annotations

import importlib.metadata
import math

import torch

from posenc_lab.positional import AttentionInputs, Dims, Positions, build_scheme

torch.manual_seed(0)
B, H, DH = 2, 4, 32
theirs_version = importlib.metadata.version("x-transformers")
from x_transformers import Decoder, TransformerWrapper  # noqa: E402
from x_transformers.attend import Attend  # noqa: E402
from x_transformers.x_transformers import PolarEmbedding, apply_polar_pos_emb  # noqa: E402

print(f"x-transformers {theirs_version}, torch {torch.__version__}")


def ours(scheme, q, k, v, L, M, same_length):
    kpos = torch.arange(-M, L)
    visible = kpos[None, :] <= torch.arange(L)[:, None]
    if same_length:
        visible &= kpos[None, :] >= torch.arange(L)[:, None] - M
    pos = Positions(q=torch.arange(L), k=kpos, offset=torch.zeros(B, dtype=torch.long), visible=visible)
    return scheme.attend(AttentionInputs(0, q[:, :, M:], k, pos, v=v))


def theirs(polar, q, k, v, M, same_length):
    n = q.shape[2]
    freqs, bias = polar(torch.arange(n))
    qp, kp = apply_polar_pos_emb(q, freqs), apply_polar_pos_emb(k, freqs + bias)
    attend = Attend(heads=H, causal=not same_length, scale=DH**-0.5)
    mask = None
    if same_length:  # a window of M + 1 keys, itself included: ours' same-length mask
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        mask = (j <= i) & (j >= i - M)
    out, _ = attend(qp, kp, v, mask=None if mask is None else mask[None, None])  # True: kept
    return out[:, :, M:]


worst = 0.0
for L, M, same_length, init in [(16, 0, False, "zero"), (16, 24, False, "uniform"), (12, 12, True, "uniform")]:
    scheme = build_scheme("pope", Dims(n_layer=2, d_model=H * DH, n_head=H), phase_init=init).train()
    polar = PolarEmbedding(DH, H)
    with torch.no_grad():
        if init == "zero":  # a trained phase is not zero: draw one inside the range, the same on both sides
            scheme.phase.uniform_(-2 * math.pi, 0.0)
        polar.learned_bias.copy_(scheme.phase[:, None, :])
    assert torch.allclose(polar.inv_freq, scheme.inv_freq), "frequencies differ"
    q, k, v = (torch.randn(B, H, M + L, DH, requires_grad=True) for _ in range(3))
    a, b = ours(scheme, q, k, v, L, M, same_length), theirs(polar, q, k, v, M, same_length)
    w = torch.randn_like(a)
    ga = torch.autograd.grad((a * w).sum(), [q, k, v, scheme.phase])
    gb = torch.autograd.grad((b * w).sum(), [q, k, v, polar.learned_bias])
    diffs = {"out": (a - b).abs().max().item()}
    for name, x, y in zip(("dq", "dk", "dv", "dphase"), ga, gb):
        diffs[name] = (x - y.reshape(x.shape)).abs().max().item()
    worst = max(worst, *diffs.values())
    shown = ", ".join(f"{n} {d:.2e}" for n, d in diffs.items())
    print(f"L={L:2d} M={M:2d} same_length={same_length!s:5} phase {init:7}: max |ours - theirs|: {shown}")
print(f"worst {worst:.2e} -> {'AGREE' if worst < 1e-5 else 'DIFFER'} (fp32, tolerance 1e-5)")

# x-transformers' own memory (TransformerWrapper's max_mem_len, one layer): the second segment with the first as
# memory, against the last 8 outputs of one pass over both (its rotary path offsets positions by the memory's length;
# does the polar path?)
for pos_emb in ("rotary_pos_emb", "polar_pos_emb"):
    torch.manual_seed(1)
    model = TransformerWrapper(
        num_tokens=50, max_seq_len=64, max_mem_len=8, attn_layers=Decoder(dim=64, depth=1, heads=2, **{pos_emb: True})
    ).eval()
    x = torch.randint(50, (1, 16))
    try:
        with torch.no_grad():
            _, mems = model(x[:, :8], return_mems=True)
            with_memory = model(x[:, 8:], mems=mems)
            one_pass = model(x)[:, 8:]
        diff = (with_memory - one_pass).abs().max().item()
        print(
            f"x-transformers Decoder({pos_emb}=True), memory of {mems[0].shape[1]}: max |memory - one pass| {diff:.2e}"
        )
    except Exception as err:  # noqa: BLE001 - the reference's own failure, reported
        print(f"x-transformers Decoder({pos_emb}=True) with mems: {type(err).__name__}: {str(err).splitlines()[0]}")

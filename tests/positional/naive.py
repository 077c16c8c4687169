"""Naive per-pair references of the schemes whose fast path is not a per-pair formula, in the papers' own
formulations (KERPLE's and Sandwich's biases and FIRE's MLP per pair, CoPE's vector interpolation, xPos's
per-channel decay, FoX's gates summed per pair, the stick broken key by key, PaTH's ``H_t`` applied one token at a
time), and the check of a scheme against them, forward and backward."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from posenc_lab.positional import AttentionInputs
from tests.positional.test_fused import grads
from tests.positional.test_schemes import DH, B, H, inputs, make_scheme, masked_softmax, pe, qkv, rope_rotate
from tests.schemes import COPE, FIRE, FOX, KERPLE_LOG, KERPLE_POWER, PATH, SANDWICH, STICKBREAKING, XPOS

BIAS = (KERPLE_LOG, KERPLE_POWER, SANDWICH, FIRE)  # pure score biases: the fused path too
CONTENT_FREE = (*BIAS, COPE, XPOS)  # read q, k, v and the positions
DATA_DEPENDENT = (FOX, STICKBREAKING, PATH)  # read the layer's input too
REFERENCED = (*CONTENT_FREE, *DATA_DEPENDENT)


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


def naive_fox(scheme, layer, q, k, v, pos, x):
    """softmax(q.k / sqrt(d_h) + sum_{l=j+1..i} log sigmoid(w_h . x_l + b_h)) v, the sum taken per pair."""
    log_f = F.logsigmoid(scheme.gate[layer](x)).permute(0, 2, 1)  # [B, H, N]
    L, N = pos.visible.shape
    M = N - L
    scores = q @ k.transpose(-1, -2) / math.sqrt(DH)
    decay = torch.zeros(B, H, L, N)
    for i in range(L):
        for j in range(N):
            if pos.visible[i, j]:
                decay[:, :, i, j] = log_f[:, :, j + 1 : M + i + 1].sum(-1)
    return masked_softmax(scores + decay, pos.visible) @ v


def naive_stickbreaking(scheme, layer, q, k, v, pos, x):
    """From the query outwards: each visible key takes beta = sigmoid(q.k / sqrt(d_h)) of the stick left, the stick
    left at the end goes to the head's vector b_h."""
    L, N = pos.visible.shape
    out = torch.zeros(B, H, L, DH)
    for i in range(L):
        stick = torch.ones(B, H)
        for j in reversed(range(N)):
            if not pos.visible[i, j] or (pos.k[j] == pos.q[i] and not scheme.attend_current):
                continue
            beta = torch.sigmoid((q[:, :, i] * k[:, :, j]).sum(-1) / math.sqrt(DH))
            out[:, :, i] += (beta * stick)[..., None] * v[:, :, j]
            stick = stick * (1 - beta)
        out[:, :, i] += stick[..., None] * scheme.remainder[layer][None]
    return out


def naive_path_transforms(scheme, layer, x):
    """w_t = normalize(silu(conv3(W x)_t)) per head (the convolution written out, zeros before the first), beta_t =
    2 sigmoid(W_beta x_t + b)."""
    w_in = scheme.w[layer](x)  # [B, N, D]
    if scheme.short_conv:
        kernel = scheme.conv[layer].weight[:, 0]  # [D, 3]: tap 2 is the current token
        padded = F.pad(w_in, (0, 0, 2, 0))
        w_in = F.silu(sum(padded[:, tap : tap + x.shape[1]] * kernel[:, tap] for tap in range(3)))
    w = w_in.view(B, x.shape[1], H, DH).permute(0, 2, 1, 3)
    w = w / w.norm(dim=-1, keepdim=True)
    return w, 2 * torch.sigmoid(scheme.beta[layer](x)).permute(0, 2, 1)


def naive_path(scheme, layer, q, k, v, pos, x):
    """s_ij = q_i^T H_{M+i} ... H_{j+1} k_j / sqrt(d_h): k_j carried through H_{j+1}, then H_{j+2}, ... one by one."""
    w, beta = naive_path_transforms(scheme, layer, x)
    return masked_softmax(path_per_pair(q, k, w, beta) / math.sqrt(DH), pos.visible) @ v


def path_per_pair(q, k, w, beta):
    """[B, H, L, N] q_i^T H_{M+i} ... H_{j+1} k_j, k_j carried through H_{j+1}, then H_{j+2}, ... one by one (later
    keys: 0)."""
    L, N = q.shape[2], k.shape[2]
    M = N - L
    rows = []
    for i in range(L):
        row = []
        for j in range(N):
            key = k[:, :, j]
            for t in range(j + 1, M + i + 1):  # H_t key = key - beta_t (w_t . key) w_t
                key = key - beta[:, :, t, None] * (w[:, :, t] * key).sum(-1, keepdim=True) * w[:, :, t]
            row.append((q[:, :, i] * key).sum(-1) if j <= M + i else torch.zeros(B, H, dtype=q.dtype))
        rows.append(torch.stack(row, -1))
    return torch.stack(rows, -2)


def new_inputs(L, M):
    return (t.requires_grad_() for t in (*qkv(L, M), inputs(L, M)))


def naive_attend(name, scheme, layer, q, k, v, pos, x=None):
    """[B, H, L, d_h] the attention output of ``name`` from its per-pair formula; ``x`` the layer's input
    [B, N, d_model], read by the data-dependent schemes."""
    if name in DATA_DEPENDENT:
        return {FOX: naive_fox, STICKBREAKING: naive_stickbreaking, PATH: naive_path}[name](
            scheme, layer, q, k, v, pos, x
        )
    if name == COPE:
        scores = naive_cope(scheme, layer, q, k, pos)
    elif name == XPOS:
        scores = naive_xpos(scheme, q, k, pos)
    else:
        scores = q @ k.transpose(-1, -2) / math.sqrt(DH) + naive_bias(name, scheme, layer, pos)
    return masked_softmax(scores, pos.visible) @ v


def assert_equals_naive(name, scheme, q, k, v, pos, x=None, layer=1):
    """Output, and the gradients of q, k, v, the layer input (when given) and every parameter, against the
    per-pair reference."""
    given = [q, k, v] + ([x] if x is not None else [])
    inputs_ = [*given, *scheme.parameters()]
    out = scheme.attend(AttentionInputs(layer, q, k, pos, v=v, context=x))
    want = naive_attend(name, scheme, layer, q, k, v, pos, x)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    names = ["q", "k", "v"] + (["context"] if x is not None else []) + [*dict(scheme.named_parameters())]
    for got, ref, what in zip(grads(out, inputs_), grads(want, inputs_), names):
        if ref is None or not ref.any():
            assert got is None or not got.any(), what
        else:
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4, msg=lambda m, what=what: f"grad of {what}: {m}")

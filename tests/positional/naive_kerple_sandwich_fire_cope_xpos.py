"""Naive per-pair references of kerple_log, kerple_power, sandwich, fire, cope and xpos, in the
papers' own formulations (FIRE's MLP per pair, CoPE's vector interpolation, xPos's per-channel decay), and
the check of a scheme against them, forward and backward."""

from __future__ import annotations

import math

import pytest
import torch

from tests.positional.test_fused import grads
from tests.positional.test_schemes import DH, B, H, make_scheme, masked_softmax, pe, rope_rotate
from tests.schemes import COPE, FIRE, KERPLE_LOG, KERPLE_POWER, SANDWICH, XPOS

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

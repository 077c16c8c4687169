"""Naive per-pair references of the data-dependent schemes (fox, stickbreaking, path), written from
docs/SCHEMES.md, and the check of a scheme against them, forward and backward."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.positional.test_fused import grads
from tests.positional.test_schemes import DH, B, H, inputs, masked_softmax, qkv
from tests.schemes import FOX, PATH, STICKBREAKING


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


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


NAIVE = {FOX: naive_fox, STICKBREAKING: naive_stickbreaking, PATH: naive_path}


def assert_equals_naive(name, scheme, q, k, v, pos, x, layer=1):
    """Output, and the gradients of q, k, v, the layer input and every parameter, against the per-pair loops."""
    inputs_ = [q, k, v, x, *scheme.parameters()]
    out = scheme.attend(layer, q, k, v, pos, 0.0, x)
    want = NAIVE[name](scheme, layer, q, k, v, pos, x)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    names = ["q", "k", "v", "context", *dict(scheme.named_parameters())]
    for got, ref, what in zip(grads(out, inputs_), grads(want, inputs_), names):
        if ref is None or not ref.any():
            assert got is None or not got.any(), what
        else:
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4, msg=lambda m, what=what: f"grad of {what}: {m}")


def new_inputs(L, M):
    return (t.requires_grad_() for t in (*qkv(L, M), inputs(L, M)))

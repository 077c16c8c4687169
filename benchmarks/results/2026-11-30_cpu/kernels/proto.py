"""One `base` layer's xl attention, forward and backward (8 streams, 8 heads, 256 queries, 512 keys, fp32,
2 threads): the current autograd path against a hand-written autograd function for the shifted scores and
softmax, and SDPA for scale; checks that both give the same output and gradients first."""

import time

import torch
import torch.nn.functional as F

from posenc_lab.positional.base import relative_shift, unshifted_mask

torch.set_num_threads(2)
torch.manual_seed(0)


class RelSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qc, qp, k, table, visible):
        G, L, dh = qc.shape
        N = k.shape[1]
        W = N + 1
        T = table.shape[0]
        buf = torch.empty(G, L * W, dtype=qc.dtype)
        torch.bmm(qp.reshape(T, -1, dh), table.transpose(1, 2), out=buf.view(T, -1, W))
        S = buf[:, L - 1 : L - 1 + L * N].view(G, L, N)
        S.baddbmm_(qc, k.transpose(1, 2))
        S.masked_fill_(~visible, float("-inf"))
        P = torch.softmax(S, -1)
        ctx.save_for_backward(qc, qp, k, table, P)
        return P

    @staticmethod
    def backward(ctx, dP):
        qc, qp, k, table, P = ctx.saved_tensors
        G, L, dh = qc.shape
        N = k.shape[1]
        W = N + 1
        T = table.shape[0]
        buf = torch.empty(G, L * W, dtype=qc.dtype)
        buf[:, : L - 1] = 0
        buf[:, L - 1 + L * N :] = 0
        dS = buf[:, L - 1 : L - 1 + L * N].view(G, L, N)
        torch.mul(P, dP, out=dS)
        dS.addcmul_(P, dS.sum(-1, keepdim=True), value=-1)
        dqc = torch.bmm(dS, k)
        dk = torch.bmm(dS.transpose(1, 2), qc)
        dBD = buf.view(T, -1, W)
        dqp = torch.bmm(dBD, table).view(G, L, dh)
        dtable = torch.bmm(qp.reshape(T, -1, dh).transpose(1, 2), dBD).transpose(1, 2)
        return dqc, dqp, dk, dtable, None


B, H, L, M, dh = 8, 8, 256, 256, 64
N = L + M
W = N + 1
qi = torch.arange(L)
kj = torch.arange(-M, L)
visible = kj[None] <= qi[:, None]


def current(q, k, v, r, u, vb):
    # mirrors xl.scores with [B,H] order
    scale = dh**-0.5
    q = q.contiguous() * scale
    qu = (q + u * scale).view(B * H, L, dh)
    qv = (q + vb * scale).view(B * H, L, dh)
    bd = torch.baddbmm(
        unshifted_mask(visible, W, q.dtype), qv, r.transpose(1, 2).expand(B, H, dh, W).reshape(B * H, dh, W)
    )
    bd = relative_shift(bd, N)
    a = torch.baddbmm(bd, qu, k.reshape(B * H, N, dh).transpose(1, 2))
    p = torch.softmax(a, -1)
    return (p @ v.reshape(B * H, N, dh)).view(B, H, L, dh)


def proto(q, k, v, r, u, vb):
    scale = dh**-0.5
    q = q.transpose(0, 1) * scale  # [H,B,L,dh] copy
    qu = (q + u[:, None] * scale).reshape(H * B, L, dh)
    qv = (q + vb[:, None] * scale).reshape(H * B, L, dh)
    P = RelSoftmax.apply(qu, qv, k.transpose(0, 1).reshape(H * B, N, dh), r, visible)
    return torch.bmm(P, v.transpose(0, 1).reshape(H * B, N, dh)).view(H, B, L, dh).transpose(0, 1)


def sdpa(q, k, v, r, u, vb):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible)


kv = torch.randn(B, N, 2, H, dh, requires_grad=True)
qq = torch.randn(B, L, H, dh, requires_grad=True)
r = torch.randn(H, W, dh, requires_grad=True)
u = torch.randn(H, 1, dh, requires_grad=True)
vb = torch.randn(H, 1, dh, requires_grad=True)


def inputs():
    q = qq.transpose(1, 2)
    k, v = kv.permute(2, 0, 3, 1, 4)
    return q, k, v


# correctness
q, k, v = inputs()
o1 = current(q, k, v, r, u, vb)
g1 = torch.autograd.grad(o1.square().sum(), (qq, kv, r, u, vb))
o2 = proto(q, k, v, r, u, vb)
g2 = torch.autograd.grad(o2.square().sum(), (qq, kv, r, u, vb))
print(
    "max diff out",
    (o1 - o2).abs().max().item(),
    [(a - b).abs().max().item() / a.abs().max().item() for a, b in zip(g1, g2)],
)
for name, fn in [("current", current), ("proto", proto), ("sdpa", sdpa)] * 3:
    ts = []
    for _ in range(6):
        q, k, v = inputs()
        t = time.perf_counter()
        o = fn(q, k, v, r, u, vb)
        o.square().sum().backward()
        ts.append(time.perf_counter() - t)
    print(name, "ms", sorted(ts)[1] * 1000)

"""One `base` layer's xl attention (8 streams, 8 heads, 256 queries, memory 256, fp32, 2 threads), forward and
backward, as the package computes it now ("current") and with the position-score GEMM run per head over all
streams at once ("per_head": [H, B*L, d_h] x [H, d_h, N+1], no expanded copy of R, the reduction over streams
inside the backward GEMM); SDPA for scale. Checks that both agree, times them interleaved (median and quartiles
of 15), then prints torch.profiler's table of 4 forward/backward passes of "current" by input shape."""

import statistics
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import posenc_lab
from posenc_lab.positional.base import mask_to_bias
from posenc_lab.positional.xl import _AddShifted

posenc_lab.keep_freed_memory()
torch.set_num_threads(2)
torch.manual_seed(0)
B, H, L, M, dh = 8, 8, 256, 256, 64
N, W, G = L + M, L + M + 1, B * H
qi, kj = torch.arange(L), torch.arange(-M, L)
visible = kj[None] <= qi[:, None]
scale = dh**-0.5


def current(q, k, v, r, u, vb):  # xl.scores + softmax + values, q [B, H, L, d_h], r [H, W, d_h]
    q = q.contiguous() * scale
    qu, qv = (q + u * scale).view(G, L, dh), (q + vb * scale).view(G, L, dh)
    bd = torch.bmm(qv, r.transpose(1, 2).expand(B, H, dh, W).reshape(G, dh, W))
    a = _AddShifted.apply(torch.bmm(qu, k.reshape(G, N, dh).transpose(1, 2)), bd)
    return torch.softmax(a.add_(mask_to_bias(visible, a.dtype)).view(B, H, L, N), -1) @ v


def per_head(q, k, v, r, u, vb):  # the same in [H, B] order, the position scores one GEMM per head
    q = q.transpose(0, 1).contiguous() * scale
    qu = (q + u.transpose(0, 1) * scale).view(G, L, dh)
    qv = (q + vb.transpose(0, 1) * scale).view(H, B * L, dh)
    bd = torch.bmm(qv, r.transpose(1, 2)).view(G, L, W)
    a = _AddShifted.apply(torch.bmm(qu, k.transpose(0, 1).reshape(G, N, dh).transpose(1, 2)), bd)
    p = torch.softmax(a.add_(mask_to_bias(visible, a.dtype)), -1)
    return torch.bmm(p, v.transpose(0, 1).reshape(G, N, dh)).view(H, B, L, dh).transpose(0, 1)


x = torch.randn(B, L, H, dh, requires_grad=True)
kv = torch.randn(B, N, 2, H, dh, requires_grad=True)
r0 = torch.randn(H, W, dh, requires_grad=True)
u0, v0 = torch.randn(1, H, 1, dh, requires_grad=True), torch.randn(1, H, 1, dh, requires_grad=True)
sq, sk, sv = (torch.randn(B, H, n, dh, requires_grad=True) for n in (L, N, N))


def run(fn):
    q = x.transpose(1, 2)
    k, v = kv.permute(2, 0, 3, 1, 4)
    out = fn(q, k, v, r0, u0, v0)
    out.square().sum().backward()
    return out


def sdpa():
    F.scaled_dot_product_attention(sq, sk, sv, attn_mask=visible).square().sum().backward()


inputs = (x, kv, r0, u0, v0)
o1, g1 = run(current), [t.grad.clone() for t in inputs]
for t in inputs:
    t.grad = None
o2, g2 = run(per_head), [t.grad.clone() for t in inputs]
worst = max(((a - b).abs().max() / a.abs().max()).item() for a, b in zip(g1, g2))
print(f"per_head against current: output {(o1 - o2).abs().max().item():.1e}, gradients (relative) {worst:.1e}")
variants = [("current", lambda: run(current)), ("per_head", lambda: run(per_head)), ("sdpa", sdpa)]
times = {name: [] for name, _ in variants}
for rep in range(16):
    for name, fn in variants if rep % 2 else variants[::-1]:
        t0 = time.perf_counter()
        fn()
        if rep:
            times[name].append((time.perf_counter() - t0) * 1e3)
for name, ts in times.items():
    q1, med, q3 = statistics.quantiles(ts, n=4)
    print(f"{name:9} median {med:6.1f} ms  quartiles {q1:6.1f}-{q3:6.1f}")
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    for _ in range(4):
        run(current)
print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=25))

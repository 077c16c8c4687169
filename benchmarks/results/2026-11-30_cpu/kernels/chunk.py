"""One `base` layer's attention, forward and backward, with the queries split into 1, 2 or 4 causal chunks
(each chunk attends only to the keys it can see): xl, shaw and sinusoid (SDPA), fp32, 2 threads."""

import time

import torch

from posenc_lab.positional import Dims, Positions, build_scheme

torch.set_num_threads(2)
B, H, L, M, dh = 8, 8, 256, 256, 64
N = L + M
qi = torch.arange(L)
kj = torch.arange(-M, L)
pos = Positions(qi, kj, torch.zeros(B, dtype=torch.long), kj[None] <= qi[:, None])
xl = build_scheme("xl", Dims(6, 512, 8))
xl.attention_impl = "unfused"
sh = build_scheme("shaw", Dims(6, 512, 8))
sh.attention_impl = "unfused"
base = build_scheme("sinusoid", Dims(6, 512, 8))


def chunked(scheme, n):
    def f(q, k, v):
        outs = []
        for c in range(n):
            i0, i1 = c * L // n, (c + 1) * L // n
            nk = M + i1
            p = Positions(pos.q[i0:i1], pos.k[:nk], pos.offset, pos.visible[i0:i1, :nk])
            outs.append(scheme.attend(0, q[:, :, i0:i1], k[:, :, :nk], v[:, :, :nk], p, 0.0))
        return torch.cat(outs, 2)

    return f


kv = torch.randn(B, N, 2, H, dh, requires_grad=True)
qq = torch.randn(B, L, H, dh, requires_grad=True)


def inputs():
    return qq.transpose(1, 2), *kv.permute(2, 0, 3, 1, 4)


q, k, v = inputs()
ref = xl.attend(0, q, k, v, pos, 0.0)
print("xl chunk4 diff", (chunked(xl, 4)(q, k, v) - ref).abs().max().item())
ref = sh.attend(0, q, k, v, pos, 0.0)
print("shaw chunk4 diff", (chunked(sh, 4)(q, k, v) - ref).abs().max().item())
fns = [(f"{s.name} x{n}", chunked(s, n)) for s in (xl, sh, base) for n in (1, 2, 4)]
res = {name: [] for name, _ in fns}
for _ in range(5):
    for name, fn in fns:
        q, k, v = inputs()
        t = time.perf_counter()
        o = fn(q, k, v)
        o.square().sum().backward()
        res[name].append(time.perf_counter() - t)
for name, ts in res.items():
    print(f"{name:12s} {sorted(ts)[2] * 1000:6.1f} ms")

"""`bmm`, `baddbmm` and `bmm` + `add_` at xl's position-score shape ([64, 256, 64] x [64, 64, 513], fp32, 2 threads),
freed memory kept: median of 8 calls each, two passes."""

import time

import torch

import posenc_lab

posenc_lab.keep_freed_memory()
torch.set_num_threads(2)
G, L, N, d = 64, 256, 513, 64
q, r, mask, full = torch.randn(G, L, d), torch.randn(G, d, N), torch.randn(L, N), torch.randn(G, L, N)
out = torch.empty(G, L, N)


def median_ms(fn, n=8):
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[n // 2] * 1e3


for rnd in range(2):
    for name, fn in [
        ("bmm", lambda: torch.bmm(q, r)),
        ("bmm into a buffer (out=)", lambda: torch.bmm(q, r, out=out)),
        ("baddbmm, [L, N] mask broadcast", lambda: torch.baddbmm(mask, q, r)),
        ("baddbmm, full [G, L, N] input", lambda: torch.baddbmm(full, q, r)),
        ("baddbmm_ in place", lambda: full.baddbmm_(q, r)),
        ("bmm then add_ of the mask", lambda: torch.bmm(q, r).add_(mask)),
        ("copy of a [G, L, N] block", lambda: out.copy_(full)),
    ]:
        print(f"pass {rnd + 1}  {name:32} {median_ms(fn):6.1f} ms")

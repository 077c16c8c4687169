"""Single kernels on a [64, 256, 512] fp32 block (8 streams x 8 heads x 256 queries x 512 keys: `base` with
memory), 2 threads, median of 5 after one warm-up: into a fresh tensor against into a kept buffer.
Run with and without MALLOC_MMAP_MAX_=0 (see ../README.md)."""

import os
import time

import torch

torch.set_num_threads(2)
G = 64


def median_ms(fn, n: int = 5) -> float:
    fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[n // 2] * 1000


print("MALLOC_MMAP_MAX_ =", os.environ.get("MALLOC_MMAP_MAX_", "unset"))
for m, k, n in [(256, 64, 512), (256, 512, 64), (512, 256, 64), (256, 64, 513)]:
    a, b = torch.randn(G, m, k), torch.randn(G, k, n)
    ms = median_ms(lambda a=a, b=b: torch.bmm(a, b))
    print(f"bmm [{G},{m},{k}] x [{G},{k},{n}], fresh output: {ms:.1f} ms  {2 * G * m * k * n / ms / 1e6:.1f} GFLOP/s")
x = torch.randn(G, 256, 512)
kept = torch.zeros_like(x)
q, kt = torch.randn(G, 256, 64), torch.randn(G, 64, 512)
print(f"zeros_like, fresh: {median_ms(lambda: torch.zeros_like(x)):.1f} ms")
print(f"zero_ on a kept buffer: {median_ms(lambda: kept.zero_()):.1f} ms")
print(f"clone, fresh: {median_ms(lambda: x.clone()):.1f} ms")
print(f"copy_ into a kept buffer: {median_ms(lambda: kept.copy_(x)):.1f} ms")
print(f"softmax, fresh: {median_ms(lambda: torch.softmax(x, -1)):.1f} ms")
ms = median_ms(lambda: torch.bmm(q, kt, out=kept))
print(
    f"bmm [{G},256,64] x [{G},64,512] into a kept buffer: {ms:.1f} ms  {2 * G * 256 * 64 * 512 / ms / 1e6:.1f} GFLOP/s"
)

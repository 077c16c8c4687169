"""Dropout's mask on the CPU: torch's F.dropout against masks drawn other ways, on one [16, 128, 128] activation
(the `small` model's, batch 16 x 128 tokens), median of 200 calls. A record: run as it was.

    python dropout_masks.py
"""

import time

import torch

torch.manual_seed(0)
x = torch.randn(16, 128, 128)
p = 0.1


def median_us(f, n: int = 200) -> float:
    f()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return sorted(times)[n // 2] * 1e6


print(f"threads {torch.get_num_threads()}")
print(f"F.dropout        {median_us(lambda: torch.nn.functional.dropout(x, p, True)):.0f} us")
print(f"bernoulli_ mask  {median_us(lambda: torch.empty_like(x).bernoulli_(1 - p)):.0f} us")
print(f"rand_like >= p   {median_us(lambda: x * (torch.rand_like(x) >= p) * (1 / (1 - p))):.0f} us")
mask = lambda: x * (torch.randint(0, 256, x.shape, dtype=torch.uint8) >= 26) * (1 / (1 - p))  # noqa: E731
print(f"randint uint8    {median_us(mask):.0f} us")
print(f"x*mask (given)   {median_us(lambda: x * 1.1):.0f} us")

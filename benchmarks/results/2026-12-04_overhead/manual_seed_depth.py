"""Process CPU time of torch.manual_seed against seeding the CPU generator alone, at a shallow stack and 40 frames
deep (about a Lightning training step's depth): torch.manual_seed formats the caller's stack for every device kind
not in use (docs/PERFORMANCE.md, the training step outside the model)."""

import time

import torch


def deep(n, f):
    return deep(n - 1, f) if n else f()


SEEDS = {
    "torch.manual_seed": lambda: torch.manual_seed(1234),
    "default_generator.manual_seed": lambda: torch.default_generator.manual_seed(1234),
}
for depth in (0, 40):
    for name, f in SEEDS.items():
        best = 1e9
        for _ in range(5):
            c = time.process_time()
            for _ in range(200):
                deep(depth, f)
            best = min(best, (time.process_time() - c) / 200)
        print(f"depth {depth:2d} {name:32s} {best * 1e6:8.1f} us CPU")

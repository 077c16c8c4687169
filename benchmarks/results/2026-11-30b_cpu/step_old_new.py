"""Whole `base` training steps (6 x 512, 8 heads, segment 256, memory 256, batch 8, fp32, 2 threads, forward,
backward and AdamW): xl and shaw with their attention scores as of commit 017764b ("old", old_017764b.py) and as
now ("new"), and sinusoid, five models in one process, their steps interleaved (every other round in reverse
order). Prints, by wall clock and by process CPU time, each variant's median step and quartiles, and its ratio to
sinusoid paired within a round."""

import statistics
import sys
import time
from pathlib import Path

import torch

import posenc_lab
from posenc_lab.model import MemoryTransformer, ModelConfig

sys.path.insert(0, str(Path(__file__).parent))
from old_017764b import OLD

posenc_lab.keep_freed_memory()
torch.set_num_threads(2)
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 8
B, L = 8, 256
variants = [("xl", "old"), ("xl", "new"), ("shaw", "old"), ("shaw", "new"), ("sinusoid", "")]
state = {}
for name, variant in variants:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=256, n_layer=6, d_model=512, n_head=8, d_inner=2048, mem_len=256, posenc=name)
    model = MemoryTransformer(cfg)
    if variant == "old":
        model.scheme.scores = OLD[name].__get__(model.scheme)
    state[name, variant] = [model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True), None]
data = torch.randint(0, 256, (B, L + 1))
times = {v: [] for v in variants}
cpu_times = {v: [] for v in variants}
for rnd in range(ROUNDS + 1):
    for key in variants if rnd % 2 == 0 else variants[::-1]:
        model, opt, mems = state[key]
        t0, c0 = time.perf_counter(), time.process_time()
        out = model(data[:, :-1], data[:, 1:], mems=mems)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        state[key][2] = out.mems
        if rnd:  # the first round warms up
            times[key].append((time.perf_counter() - t0) * 1e3)
            cpu_times[key].append((time.process_time() - c0) * 1e3)
for clock, table in (("wall", times), ("cpu", cpu_times)):
    base = table["sinusoid", ""]
    for (name, variant), ts in table.items():
        q1, med, q3 = statistics.quantiles(ts, n=4)
        ratios = [t / b for t, b in zip(ts, base)]
        print(
            f"{clock:4} {name:8} {variant:3}  median {med:6.0f} ms  quartiles {q1:6.0f}-{q3:6.0f}  "
            f"ratio to sinusoid: median {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]"
        )

"""One `base` layer's attention, forward and backward (8 streams, 8 heads, 256 queries, memory 256, fp32, 2 threads):
xl and shaw as of commit 017764b (baddbmm with the mask laid out before the shift; Shaw's keys through a gathered
[L, N+1] GEMM) against the package's current code, and SDPA (what sinusoid runs) for scale. Checks first that old
and new give the same output and gradients, then times them interleaved: REPS rounds, each timing every variant
once; prints the median and quartiles per variant."""

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import posenc_lab
from posenc_lab.positional import Dims, build_scheme
from posenc_lab.positional.base import Positions

sys.path.insert(0, str(Path(__file__).parent))
from old_017764b import OLD

posenc_lab.keep_freed_memory()
torch.set_num_threads(2)
torch.manual_seed(0)
REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 15
B, H, L, M, dh = 8, 8, 256, 256, 64
N, W, G = L + M, L + M + 1, B * H
qi, kj = torch.arange(L), torch.arange(-M, L)
pos = Positions(qi, kj, torch.zeros(B, dtype=torch.long), kj[None] <= qi[:, None])
dims = Dims(n_layer=1, d_model=H * dh, n_head=H)


schemes = {}
for name, old in OLD.items():
    s = build_scheme(name, dims).train()
    s.attention_impl = "unfused"
    with torch.no_grad():
        for p in s.parameters():
            p.normal_(0, 0.1)
    schemes[name] = (s, old)
q = torch.randn(B, H, L, dh, requires_grad=True)
k = torch.randn(B, H, N, dh, requires_grad=True)
v = torch.randn(B, H, N, dh, requires_grad=True)


def run(name, variant):
    if name == "sdpa":
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=pos.visible)
        out.square().sum().backward()
        return out, None
    s, old = schemes[name]
    if variant == "old":
        s.scores = old.__get__(s)
    out = s.attend(0, q, k, v, pos, 0.0)
    out.square().sum().backward()
    if variant == "old":
        del s.scores
    return out, s


for name in schemes:
    grads = {}
    for variant in ("old", "new"):
        for t in (q, k, v, *schemes[name][0].parameters()):
            t.grad = None
        out, s = run(name, variant)
        grads[variant] = [out.detach()] + [t.grad.clone() for t in (q, k, v, *s.parameters())]
    worst = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(grads["new"], grads["old"]))
    print(f"{name}: new against old, output and gradients, largest relative difference {worst:.2e}")

variants = [("xl", "old"), ("xl", "new"), ("shaw", "old"), ("shaw", "new"), ("sdpa", "")]
times = {v_: [] for v_ in variants}
for rep in range(REPS + 1):
    order = variants if rep % 2 == 0 else variants[::-1]
    for name, variant in order:
        t0 = time.perf_counter()
        run(name, variant)
        if rep:
            times[name, variant].append((time.perf_counter() - t0) * 1e3)
for (name, variant), ts in times.items():
    q1, med, q3 = statistics.quantiles(ts, n=4)
    print(f"{name:5} {variant:4} median {med:6.1f} ms  quartiles {q1:6.1f}-{q3:6.1f}  ({len(ts)} reps)")

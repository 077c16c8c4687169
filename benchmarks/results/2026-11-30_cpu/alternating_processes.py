"""Train steps of several schemes alternating in one process (base sizes, memory 256, fp32, 2 threads):
median per scheme and its ratio to the last. Run as (2026-11-30, the log beside this file):

    for i in 1 2; do for e in keep system; do
      if [ $e = system ]; then export MALLOC_MMAP_MAX_=65536; else unset MALLOC_MMAP_MAX_ MALLOC_TRIM_THRESHOLD_; fi
      echo "== $e run $i"; python alternating_processes.py xl,shaw,sinusoid 4
    done; done
"""

import resource
import statistics
import sys
import time

import torch

import posenc_lab
from posenc_lab.model import MemoryTransformer, ModelConfig

print("keep applied:", posenc_lab.keep_freed_memory())
torch.set_num_threads(2)
schemes = sys.argv[1].split(",")
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
B, L = 8, 256
state = {}
for s in schemes:
    torch.manual_seed(0)
    m = MemoryTransformer(
        ModelConfig(
            vocab_size=256,
            n_layer=6,
            d_model=512,
            n_head=8,
            d_inner=2048,
            mem_len=256,
            posenc=s,
            attention_impl="unfused",
        )
    )
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True)
    state[s] = [m, opt, None, []]
data = torch.randint(0, 256, (B, L + 1))


def step(s):
    m, opt, mems, ts = state[s]
    t = time.perf_counter()
    out = m(data[:, :-1], data[:, 1:], mems=mems)
    opt.zero_grad(set_to_none=True)
    out.loss.backward()
    opt.step()
    state[s][2] = out.mems
    return time.perf_counter() - t


for r in range(rounds + 1):
    for s in schemes:
        dt = step(s)
        if r:
            state[s][3].append(dt)
base = statistics.median(state[schemes[-1]][3])
for s in schemes:
    med = statistics.median(state[s][3])
    print(f"{s:10s} median {med * 1000:7.0f} ms  ratio {med / base:.3f}  all {[round(x * 1000) for x in state[s][3]]}")

print("maxrss_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)

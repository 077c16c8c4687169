"""torch.profiler table of two `base` training steps (memory 256, fp32, 2 threads) of the scheme named first."""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from posenc_lab.model import MemoryTransformer, ModelConfig

torch.set_num_threads(2)
scheme = sys.argv[1]
cfg = ModelConfig(
    vocab_size=256, n_layer=6, d_model=512, n_head=8, d_inner=2048, mem_len=256, posenc=scheme, attention_impl="unfused"
)
m = MemoryTransformer(cfg)
B, L = 8, 256
x = torch.randint(0, 256, (B, L))
y = torch.randint(0, 256, (B, L))
with torch.no_grad():
    mems = m(x).mems


def step():
    out = m(x, y, mems=mems)
    out.loss.backward()


step()

with profile(activities=[ProfilerActivity.CPU]) as p:
    step()
    step()
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))

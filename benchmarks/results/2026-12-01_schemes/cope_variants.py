"""CoPE's attention for one `base` layer (8 streams, 8 heads, 256 queries, memory 256, fp32, 2 threads), forward
and backward, as autograd computed it before commit 5d89b66 (``autograd``) and as the package computes it now
(``package``, its hand-written backward), with SDPA (what sinusoid runs) for scale. Checks first that the two CoPE
versions agree, then times all three interleaved: REPS rounds, each timing every variant once, in process CPU time
(both threads); prints the median and quartiles per variant. Run with OMP_WAIT_POLICY=PASSIVE (as the CLI sets):
spinning OpenMP threads distort every figure on a loaded machine."""

import statistics
import sys
import time

import torch
import torch.nn.functional as F

import posenc_lab
from posenc_lab.positional import Dims, Positions, build_scheme
from posenc_lab.positional.base import mask_to_bias

posenc_lab.keep_freed_memory()
torch.set_num_threads(2)
torch.manual_seed(0)
REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 15
B, H, L, M, dh = 8, 8, 256, 256, 64
N = L + M
qi, kj = torch.arange(L), torch.arange(-M, L)
pos = Positions(qi, kj, torch.zeros(B, dtype=torch.long), kj[None] <= qi[:, None])
cope = build_scheme("cope", Dims(n_layer=1, d_model=H * dh, n_head=H), max_position=N).train()
with torch.no_grad():
    cope.embedding.normal_(0, 0.1)
q, k, v = (torch.randn(B, H, n, dh, requires_grad=True) for n in (L, N, N))
grad_out = torch.randn(B, H, L, dh)


def autograd_cope():
    """The scores as first committed (a8d36c5): autograd through flips, a cumsum, two gathers."""
    content = (q * dh**-0.5) @ k.transpose(-1, -2) + mask_to_bias(pos.visible, q.dtype)
    count = torch.sigmoid(content).flip(-1).cumsum(-1).flip(-1).clamp(max=N)
    floor = count.detach().floor()
    z = q @ cope.embedding[0].T
    step = F.pad(z.diff(dim=-1), (0, 1))
    index = floor.long()
    scores = content + z.gather(-1, index) + (count - floor) * step.gather(-1, index)
    return torch.softmax(scores, -1) @ v


VARIANTS = {
    "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=pos.visible),
    "autograd": autograd_cope,
    "package": lambda: cope.attend(0, q, k, v, pos, 0.0),
}
inputs = [q, k, v, cope.embedding]
want = torch.autograd.grad(autograd_cope(), inputs, grad_out)
got = torch.autograd.grad(VARIANTS["package"](), inputs, grad_out)
for a, b, name in zip(got, want, ["q", "k", "v", "e"]):
    # counts that land within rounding of an integer may take the other piece: compare all but a few elements
    close = torch.isclose(a, b, atol=1e-4, rtol=1e-3).float().mean().item()
    print(f"grad of {name}: {close:.4%} of elements agree")
times = {name: [] for name in VARIANTS}
for _ in range(REPS):
    for name, f in VARIANTS.items():
        t = time.process_time()
        torch.autograd.grad(f(), [q, k, v] if name == "sdpa" else inputs, grad_out)
        times[name].append(time.process_time() - t)
for name, ts in times.items():
    low, _, high = (t * 1e3 for t in statistics.quantiles(ts))
    print(f"{name:9s} median {statistics.median(ts) * 1e3:6.1f} ms  quartiles {low:6.1f}-{high:6.1f}")

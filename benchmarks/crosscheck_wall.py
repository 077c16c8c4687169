"""posenc-lab's wall against flash-linear-attention's naive Wall reference, side by side (not project code, not a
dependency).

    python benchmarks/crosscheck_wall.py [--fla-git DIR | --fla-naive FILE]

fla's ``naive_wall_attn`` (fla/ops/wall_attn/naive.py, its "correctness oracle") runs from its own source file. On a
machine with fla installed it is imported; elsewhere (fla needs triton) the file is read from a git checkout or
mirror of fla-org/flash-linear-attention (default: the mirror this was run with), and its two imports are given
their torch equivalents: ``RCP_LN2`` (1/ln 2, fla's value) and ``chunk_global_cumsum(g, scale=s)`` (a Triton
inclusive cumsum over time, times s: ``torch.cumsum(g, 1) * s``). Nothing else of it is touched.

The gates are fla's layer's: ``g = logsigmoid(g_proj(x))`` with g_proj the same D -> D map as ours, its bias our
bias plus ``gate_bias`` (fla's ``gate_init_bias``). Ours runs a segment of L queries over M memory keys whose gates
come from the memory's states; fla's one causal pass over the M + L tokens (``window_size = M + 1`` for our
same-length mask), of which the last L rows are compared: forward, and the gradients of q, k, v, the layer input
and the gate's weight and bias. Gates near 1 (fla's start), near 1/2, and closed hard at a few tokens.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import types

import torch
import torch.nn.functional as F

from posenc_lab.positional import AttentionInputs, Dims, Positions, build_scheme

MIRROR = "/work/.mirror/fla-org+flash-linear-attention/repo"
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--fla-git", default=MIRROR, help="a git checkout or mirror of fla-org/flash-linear-attention")
parser.add_argument("--fla-naive", help="fla/ops/wall_attn/naive.py as a file (instead of --fla-git)")
args = parser.parse_args()

try:
    from fla.ops.wall_attn import naive_wall_attn

    where = "the installed fla package"
except ImportError:
    if args.fla_naive:
        source, where = open(args.fla_naive).read(), args.fla_naive
    else:
        git = ["git", "-C", args.fla_git]
        commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        source = subprocess.run(
            [*git, "show", "HEAD:fla/ops/wall_attn/naive.py"], capture_output=True, text=True, check=True
        ).stdout
        where = f"fla-org/flash-linear-attention@{commit[:12]}:fla/ops/wall_attn/naive.py"
    stubs = {
        "fla": {},
        "fla.ops": {},
        "fla.ops.utils": {},
        "fla.ops.utils.constant": {"RCP_LN2": 1.4426950216},
        "fla.ops.utils.cumsum": {
            "chunk_global_cumsum": lambda g, cu_seqlens=None, scale=None: (
                torch.cumsum(g.float(), 1).to(g.dtype) * (1.0 if scale is None else scale)
            )
        },
    }
    for name, attrs in stubs.items():
        sys.modules[name] = types.ModuleType(name)
        sys.modules[name].__dict__.update(attrs)
    naive = types.ModuleType("fla_wall_naive")
    exec(compile(source, where, "exec"), naive.__dict__)
    naive_wall_attn = naive.naive_wall_attn
print(f"fla's naive_wall_attn from {where}; torch {torch.__version__}")

torch.manual_seed(0)
B, H, DH = 2, 4, 16
D = H * DH


def ours(scheme, q, k, v, x, L, M, same_length):
    kpos = torch.arange(-M, L)
    visible = kpos[None, :] <= torch.arange(L)[:, None]
    if same_length:
        visible &= kpos[None, :] >= torch.arange(L)[:, None] - M
    pos = Positions(q=torch.arange(L), k=kpos, offset=torch.zeros(B, dtype=torch.long), visible=visible)
    return scheme.attend(AttentionInputs(0, q[:, :, M:], k, pos, v=v, context=x))


def theirs(scheme, q, k, v, x, M, same_length):
    """fla's layout is [B, T, H, K]; g as its layer makes it, our map with our bias + gate_bias."""
    g = F.logsigmoid(F.linear(x, scheme.gate[0].weight, scheme.gate[0].bias + scheme.gate_bias).float())
    t = lambda a: a.transpose(1, 2)  # noqa: E731
    out = naive_wall_attn(
        t(q), t(k), t(v), g.view(B, -1, H, DH), scale=DH**-0.5, window_size=M + 1 if same_length else None
    )
    return t(out)[:, :, M:]


worst = 0.0
cases = [
    (16, 0, False, 8.0, "fla's start: f = 0.9997"),
    (16, 40, False, 0.0, "f near 1/2"),
    (12, 12, True, 0.0, "f near 1/2, same-length window"),
    (20, 44, False, "closed", "closed hard at 6 tokens"),
]
for L, M, same_length, gate, what in cases:
    scheme = build_scheme("wall", Dims(n_layer=1, d_model=D, n_head=H), gate_bias=4.0 if gate == "closed" else gate)
    scheme.train().block = 16  # several anchors, and blocks of 8 inside (the default, 32, serves longer segments)
    q, k, v = (torch.randn(B, H, M + L, DH, requires_grad=True) for _ in range(3))
    x = torch.randn(B, M + L, D)
    if gate == "closed":  # W = I, b = 0: g = logsigmoid(x + 4), x = -68 at six tokens (a gate of e^-64)
        with torch.no_grad():
            scheme.gate[0].weight.copy_(torch.eye(D))
            scheme.gate[0].bias.zero_()
            x.zero_()[:, [3, 17, 30, 41, 50, 58]] = -68.0
    x.requires_grad_()
    a, b = ours(scheme, q, k, v, x, L, M, same_length), theirs(scheme, q, k, v, x, M, same_length)
    w = torch.randn_like(a)
    leaves = [q, k, v, x, scheme.gate[0].weight, scheme.gate[0].bias]
    ga, gb = (torch.autograd.grad((o * w).sum(), leaves) for o in (a, b))
    diffs = {"out": (a - b).abs().max().item()}
    nonfinite = []  # a gradient that is NaN or inf on one side: named, and left out of the comparison
    for n, p, r in zip(("dq", "dk", "dv", "dx", "dW", "db"), ga, gb):
        if not (p.isfinite().all() and r.isfinite().all()):
            nonfinite.append(
                f"{n}: ours {'finite' if p.isfinite().all() else 'NOT finite'}, fla's "
                f"{'finite' if r.isfinite().all() else 'NOT finite'}"
            )
            continue
        diffs[n] = (p - r).abs().max().item()
    worst = max(worst, *diffs.values())
    shown = ", ".join(f"{n} {d:.1e}" for n, d in diffs.items())
    shown += "".join(f"; {n}" for n in nonfinite)
    print(f"L={L:2d} M={M:2d} same_length={same_length!s:5} {what:31}: max |ours - fla|: {shown}")
print(
    f"worst {worst:.2e} -> {'AGREE' if worst < 1e-4 else 'DIFFER'} (fp32, tolerance 1e-4; gradients where both are "
    "finite)"
)

"""The small models the unit tests build: one factory for every test of the model, the schemes and the
evaluation functions (a few hundred parameters, deterministic)."""

from __future__ import annotations

import torch

from posenc_lab.model import MemoryTransformer, ModelConfig
from tests.schemes import COPE, FIRE, FOX, HYBRID, LEARNED, ROPE, SHAW, T5

# Options that make the interesting branches reachable at test sizes (clipping, log buckets, FIRE's interpolation
# past its threshold, CoPE's counts clamped at its maximum position).
OPTIONS = {
    SHAW: {"K": 3},
    T5: {"n_buckets": 8, "max_distance": 20},
    LEARNED: {"max_positions": 64},
    FIRE: {"init_threshold": 3.0},
    COPE: {"max_position": 6},
    HYBRID: {"layers": [ROPE, FOX]},  # two layers or more: a rotation and a data-dependent bias, each its own part
}


def make_model(
    name: str, n_layer: int = 1, mem_len: int = 0, randomize: str | None = "scheme", vocab_size: int = 23, **cfg
) -> MemoryTransformer:
    """A 16-wide model of scheme ``name`` in eval mode. randomize: "scheme" draws the scheme's parameters from
    N(0, 0.5) (zero-initialised tables, t5's bias and xl's u and v, would make tests vacuous), "all" every
    parameter (every visible token then makes a clear difference), None keeps the initialisation."""
    torch.manual_seed(0)
    options = dict(OPTIONS.get(name, {}))
    if name == HYBRID:  # its pattern's first n_layer schemes: a pattern longer than the model is refused
        options["layers"] = options["layers"][:n_layer]
    config = ModelConfig(
        vocab_size=vocab_size,
        n_layer=n_layer,
        mem_len=mem_len,
        posenc=name,
        **{"d_model": 16, "n_head": 2, "d_inner": 32, "dropout": 0.0, "posenc_kwargs": options, **cfg},
    )
    model = MemoryTransformer(config)
    if randomize is not None:
        with torch.no_grad():
            for p in (model.scheme if randomize == "scheme" else model).parameters():
                p.normal_(0.0, 0.5)
    return model.eval()


def memory_and_window(model: MemoryTransformer, stream: torch.Tensor, segment_len: int):
    """(the last segment's output, read segment by segment with memory; one pass over the whole ``stream`` without
    memory). stream: [B, M + L] tokens, so that a one-layer model's last segment with its M memory keys sees
    exactly what the window pass gives its last L queries: their logits must agree."""
    L, mems = segment_len, None
    for t in range(stream.shape[1] // L):
        out = model(stream[:, t * L : (t + 1) * L], mems=mems, offset=t * L)
        mems = out.mems
    return out, model(stream, mem_len=0)

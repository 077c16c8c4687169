"""The model FLOP count behind MFU: matmul FLOPs per predicted token."""

from __future__ import annotations

from ..model import MemoryTransformer, ModelConfig
from ..positional import PositionalScheme, build_scheme


def model_flops_per_token(
    model: ModelConfig | MemoryTransformer, segment_len: int, mem_len: int, training: bool = True, batch_size: int = 1
) -> float:
    """Matmul FLOPs per predicted token of one segment of ``segment_len`` tokens with ``mem_len`` memory.

    Counts 2*m*n*k for every matrix product of the model, per segment (per stream), divided by
    ``segment_len``:

    per layer (L = segment_len, M = mem_len, N = M + L, D = d_model, F = d_inner):
      q projection            2 L D D
      k, v projections        2 N D 2D       (the memory's states are projected again every segment)
      scores q k^T            2 L N D        (every query against all N keys; the causal mask is not discounted)
      values p v              2 L N D
      output projection       2 L D D
      feed-forward            2 L D F  x 2
      the scheme's own        scheme.extra_flops(L, M, batch_size)  (e.g. xl's position projection)
    output head                2 L D V        (an adaptive softmax costs less: a tail only for its tokens)
    Embedding lookups, layer norms, softmax and element-wise work are not counted.
    Training = 3 x forward (the backward pass costs two matmuls per forward matmul).
    """
    cfg = model.cfg if isinstance(model, MemoryTransformer) else model
    scheme: PositionalScheme = (
        model.scheme
        if isinstance(model, MemoryTransformer)
        else build_scheme(cfg.posenc, cfg.dims, **cfg.posenc_kwargs)
    )
    L, M = int(segment_len), int(mem_len)
    N, D, F, V = M + L, cfg.d_model, cfg.d_inner, cfg.vocab_size
    per_layer = (
        2 * L * D * D  # q
        + 2 * N * D * 2 * D  # k, v
        + 2 * L * N * D  # q k^T
        + 2 * L * N * D  # p v
        + 2 * L * D * D  # output projection
        + 2 * 2 * L * D * F  # feed-forward
        + scheme.extra_flops(L, M, batch_size)
    )
    forward = cfg.n_layer * per_layer + 2 * L * D * V
    return (3 if training else 1) * forward / L

"""FIRE (Li et al. 2023): a learned function of the progressively interpolated log distance, as a score bias.

Per layer, an MLP f: R -> R^H (one hidden layer of ``width`` ReLU units, one output per head) of the distance
d = i - j, log-transformed and divided by the query's own position:

    psi(x)    = log(1 + c x),                         c > 0 learned
    b(i, j)   = f( psi(i - j) / psi(max(L, i)) ),      L > 0 learned (the threshold)
    scores_ij = q_i . k_j / sqrt(d_h) + b_h(i, j)

Dividing by psi(i) maps every query's distances into [0, 1] ("progressive interpolation"): a query far into a
long context reads the same range of inputs as the queries of training did. The threshold L keeps the
normaliser from being tiny for the first queries: below it, the bias is a function of the distance alone.

With memory, the query position i is the number of keys before it that it can see, i.e. its largest visible
distance (M + i with a full memory, the window minus one with the same-length mask). That is the paper's i
(keys 0..i visible, largest distance i) whenever there is no memory, and it keeps memory transparent: a
segment with memory scores exactly as the same tokens at the end of one long run. FIRE is not translation
invariant: the same content at the same distance scores differently once the query sees more than L keys.

Choices the paper leaves open: initial c = 1 (``init_c``) and initial L = the training attention span M + L
(``init_threshold``, null sizes it to the run), so that in training every query is below the threshold and the
interpolation starts past the trained length; c >= 0.01 and L >= 1 held by projection; one MLP, c and L per
layer (the paper's FIRE-S, shared by the layers, is not offered).

The MLP is never evaluated per pair (that would be an [L, N, width] tensor): a one-hidden-layer ReLU MLP of a
scalar is piecewise linear, with a kink where each unit switches on, so each pair looks up the slope and
intercept of its piece (``mlp_pieces``): [H, L, N] scalars, exactly the MLP, its gradients included.
"""

import torch
from torch import Tensor, nn

from .base import Dims, PairBias, PositionalScheme, Positions
from .registry import register

EPS = 1e-2  # lower bound of c


def mlp_pieces(mlp: nn.Sequential) -> tuple[Tensor, Tensor, Tensor]:
    """The MLP x -> W2 relu(w1 x + b1) + b2 of a scalar x (w1, b1: [W], W2: [H, W], b2: [H]) as pieces.

    Returns kinks [W] sorted (-b1/w1, where each unit switches) and slope, intercept [H, (W+1)^2] of each piece.
    Piece a (W+1) + b holds the x with a kinks strictly below and b kinks at or below them (a < b only on a
    kink). There unit w is on iff w1 > 0 and its kink is strictly below x (rank < a), or w1 < 0 and its kink is
    strictly above x (rank >= b), or w1 = 0 and b1 > 0: ties off, as torch's relu at 0, gradients included.
    """
    w1, b1, w2, b2 = mlp[0].weight[:, 0], mlp[0].bias, mlp[2].weight, mlp[2].bias
    W = w1.shape[0]
    with torch.no_grad():
        kinks, order = torch.where(w1 != 0, -b1 / w1, torch.inf).sort()
        rank = torch.empty_like(order)
        rank[order] = torch.arange(W, device=w1.device)
        n = torch.arange(W + 1, device=w1.device)
        below, at_or_below = n.repeat_interleave(W + 1)[:, None], n.repeat(W + 1)[:, None]  # a, b per piece
        on = torch.where(w1 > 0, rank < below, torch.where(w1 < 0, rank >= at_or_below, b1 > 0)).to(w2.dtype)
    slope = (on * w1) @ w2.T  # [(W+1)^2, H]: sum over the units on of W2 w1
    intercept = (on * b1) @ w2.T + b2  # ... of W2 b1, plus b2
    return kinks, slope.T, intercept.T


@register
class FIRE(PositionalScheme):
    name = "fire"
    kind = "relative"
    family = "relative bias, not translation invariant"
    positions_enter = "an MLP of `log(c d + 1) / log(c max(i, L) + 1)`"
    with_memory = "`i` = the keys a query sees"
    projected = {"c": (EPS, None), "threshold": (1.0, None)}
    # not measured on a GPU: a learned bias, whose gradient SDPA cannot give (as t5: fused 0.46x unfused)
    fused_from_keys = 0
    not_translation_invariant = (
        "the distance is divided by the query's position (its largest visible distance): once a query sees more "
        "than the threshold L keys, the same content at the same distance scores differently"
    )

    def __init__(self, dims: Dims, *, width: int = 32, init_c: float = 1.0, init_threshold: float | None = None):
        super().__init__(dims)
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"fire: width (the MLP's hidden units) must be an integer >= 1, got {width!r}")
        if init_threshold is None:
            raise ValueError(
                "fire: init_threshold=None must be sized to the run before the scheme is built "
                "(posenc_lab.positional.sized_options, as training does), or set a number >= 1"
            )
        for option, value, low in (("init_c", init_c, EPS), ("init_threshold", init_threshold, 1.0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low:
                raise ValueError(f"fire: {option} must be a number >= {low}, got {value!r}")
        self.width = width
        self.mlp = nn.ModuleList(
            nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, dims.n_head)) for _ in range(dims.n_layer)
        )
        self.c = nn.Parameter(torch.full((dims.n_layer,), float(init_c)))
        self.threshold = nn.Parameter(torch.full((dims.n_layer,), float(init_threshold)))

    @classmethod
    def sized_options(cls, options: dict, segment_len: int, mem_len: int, max_offset: int = 0) -> dict:
        """init_threshold=None -> segment_len + mem_len: every query of training is below it."""
        if options.get("init_threshold") is None:
            return {**options, "init_threshold": float(segment_len + mem_len)}
        return dict(options)

    def extra_flops(self, segment_len: int, mem_len: int, batch_size: int = 1) -> float:
        """The MLP per pair (the model's math, not the piecewise lookup), shared by the streams: 2 L N W (1 + H)."""
        L, N = segment_len, segment_len + mem_len
        return 2 * L * N * self.width * (1 + self.dims.n_head) / batch_size

    def inputs(self, layer: int, pos: Positions) -> Tensor:
        """[L, N] the MLP's input psi(i - j) / psi(max(L, i)), i the query's largest visible distance."""
        c, threshold = self.constrained("c")[layer], self.constrained("threshold")[layer]
        distance = pos.distance.clamp(min=0).to(c.dtype)  # future keys (masked) at 0
        seen = pos.distance.masked_fill(~pos.visible, 0).amax(-1).to(c.dtype)  # [L] i: keys it sees before it
        return torch.log1p(c * distance) / torch.log1p(c * torch.maximum(threshold, seen))[:, None]

    def score_bias(self, layer: int, pos: Positions, context: Tensor | None = None) -> PairBias:
        x = self.inputs(layer, pos)
        kinks, slope, intercept = mlp_pieces(self.mlp[layer])
        xd = x.detach().contiguous()
        piece = torch.searchsorted(kinks, xd) * (self.width + 1) + torch.searchsorted(kinks, xd, right=True)
        return PairBias(slope[:, piece] * x + intercept[:, piece])  # [H, L, N]: f_h(x) on the piece of x

    def extra_repr(self) -> str:
        return f"width={self.width}"

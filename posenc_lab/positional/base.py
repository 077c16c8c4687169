"""The one interface every positional scheme implements.

A scheme can act in three places of a memory transformer, and overrides only those it needs:

1. ``embed``   the input embedding (absolute schemes add a position vector to ``E[x]``);
2. the attention scores: ``rotate`` q and k (RoPE), add a ``score_bias`` (ALiBi, T5, FIRE, FoX), or write
   ``attend`` itself (XL, Shaw, CoPE, stick-breaking, PaTH);
3. the value aggregation (Shaw's ``a^V``), in its own ``attend``, since it needs the probabilities.

The default ``attend`` is ``scaled_dot_product_attention`` over ``rotate(q, k)`` plus the ``score_bias``; a bias
comes in one of three forms (``DistanceBias``, ``PairBias``, ``CumulativeBias``), each of which both attention
paths read: SDPA as a dense tensor, the fused path (``fused.py``, flex_attention on CUDA) per pair. A scheme
states its bias once and gets both.

Positions are handed over, never guessed: the model builds one ``Positions`` per segment with the query
positions ``i in [0, L)``, the key positions ``j in [-M, L)`` (memory keys are negative), the stream offset
``s`` of every stream and the visibility mask. Data-dependent schemes (FoX's gates, PaTH's transforms) also get
the layer's input over the keys, ``context`` = [memory ; segment] (the states k and v are projected from), to
project with their own parameters: the memory's part is the memory's own hidden states, so a memory position's
gate or transform is the one it had as a segment position.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import fused
from .positions import Dims, Positions


class PositionDropout(nn.Dropout):
    """Dropout on a scheme's position embeddings (xl's R). Its rate is the model's ``pos_dropout``,
    set by the model on every such module, so that each scheme gets the same option."""

    def __init__(self):
        super().__init__(0.0)


def project_(param: Tensor, low: float, high: float | None = None) -> Tensor:
    """Keep a constrained parameter inside [low, high] (projected gradient descent, as KERPLE's authors do):
    clamped in place before each use, so that an optimiser step that left the range is undone before the
    next forward. Through ``.data``, so autograd's version counter is untouched and a graph still waiting for
    its backward stays valid: the value only changes right after an optimiser step.

    Inside a compiled graph nothing is written: the in-place clamp would become a write-back into ``param`` at
    the graph's end, and inductor's backward, which reads ``param`` again, then fails on its version counter
    (fire, kerple and pope did). There the clamped value is returned with the identity gradient (PGD's), and
    the write is ``PositionalScheme.project_parameters_``'s, before the forward, outside the graph."""
    if torch.compiler.is_compiling():
        return param + (param.detach().clamp(min=low, max=high) - param.detach())
    param.data.clamp_(min=low, max=high)
    return param


def mask_to_bias(visible: Tensor, dtype: torch.dtype) -> Tensor:
    """[L, N] bool -> [L, N] additive mask: 0 where visible, -inf elsewhere."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(~visible, float("-inf"))


class _SinkSoftmax(torch.autograd.Function):
    """p_ij = exp(z_ij) / (exp(s_h) + sum_j exp z_ij), at about the plain softmax's cost (written as autograd of
    logsumexp, exp and a subtraction it took 1.2x xl's step). Forward: the plain softmax q_ij times the share the
    sink leaves, r_i = sigmoid(LSE_i - s_h), where LSE_i = max_j z_ij - log max_j q_ij (the largest probability is at
    least 1 / N, so its log is exact): two row maxima, no exp of its own. Backward: the softmax's own fused
    backward, dz_j = p_j (g_j - D), D = sum_k p_k g_k (the sink's column has no value, so the sum runs over the keys),
    and ds = -p_sink D = -sum_j dz_j (since sum_j dz_j = D - (1 - p_sink) D). A row must see a key (every row of the
    model does: its own), as for the plain softmax."""

    @staticmethod
    def forward(ctx, z: Tensor, sink: Tensor) -> Tensor:
        p = torch.softmax(z, dim=-1, dtype=torch.float32)  # q_ij
        lse = z.amax(-1, keepdim=True).float() - p.amax(-1, keepdim=True).log()
        p.mul_(torch.sigmoid(lse - sink.float()[:, None, None]))  # q_ij r_i
        ctx.save_for_backward(p)
        ctx.dtypes = z.dtype, sink.dtype
        return p.to(z.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (p,) = ctx.saved_tensors
        dz = torch._softmax_backward_data(grad.float(), p, -1, torch.float32)
        dims = [d for d in range(dz.dim()) if d != dz.dim() - 3]  # every dim but the heads'
        return dz.to(ctx.dtypes[0]), (-dz.sum(dims)).to(ctx.dtypes[1])


@dataclass(frozen=True)
class Softmax:
    """The model's changes to every scheme's softmax (model options, not a scheme's), one object that ``attend``
    and ``attention_probs`` read (``AttentionInputs.softmax``):

        p_ij = exp(lambda_i z_ij) / (exp(s_h) + sum_j' exp(lambda_i z_ij'))        z_ij: the scheme's whole logit

    ``scale`` lambda [H, L, 1] (SSMax's s_h log n_i, ``posenc_lab.softmax_scale``; None: 1) multiplies the whole
    logit; a scheme applies it where it is cheapest (on q, where its logit is linear in q). ``sink`` s [H] (None: no
    sink) is the logit of a key every query sees and whose value is zero (a learned attention sink, gpt-oss's
    ``sinks``): a row's probabilities then sum to less than one, the rest going to no value. The sink's logit is
    not scaled by lambda (it is a learned logit of the denominator, not a pair's score)."""

    scale: Tensor | None = None
    sink: Tensor | None = None

    def probs(self, scores: Tensor) -> Tensor:
        """[..., H, L, N] scores (``scale`` already applied, -inf where not visible) -> probabilities, the same
        shape and dtype; with a sink, exp(z_ij - log(exp(s_h) + sum_j exp z_ij)), in fp32."""
        if self.sink is None:
            return torch.softmax(scores, dim=-1)  # bf16 in, bf16 out: fp32 inside the kernel
        return _SinkSoftmax.apply(scores, self.sink)

    def unscaled(self) -> Softmax:
        """The same softmax once a scheme has applied ``scale`` itself (on q)."""
        return Softmax(None, self.sink)


#: No change: the plain softmax.
PLAIN = Softmax()


@dataclass(frozen=True)
class AttentionInputs:
    """What one layer's attention hands its scheme, the one argument of ``attend`` and ``attention_probs``; a scheme
    reads what it needs and ignores the rest:

        layer      the layer's index (a scheme's per-layer parameters)
        q          [B, H, L, d_h] the segment's queries
        k, v       [B, H, N, d_h] the keys and values of [memory ; segment] (v: None for ``attention_probs``)
        pos        the segment's ``Positions`` (query and key positions, the visibility mask)
        context    [B, N, D] the layer's input over the keys, [memory ; segment], which k and v are projected from:
                   data-dependent schemes (FoX's gates, PaTH's transforms) project it with their own parameters
        dropout_p  dropout on the attention probabilities (0 in evaluation)
        softmax    the model's changes to the softmax (``Softmax``: SSMax's scale, a sink); PLAIN for a scheme that
                   refuses them (``softmax_refused``), since ModelConfig refuses the options first
    """

    layer: int
    q: Tensor
    k: Tensor
    pos: Positions
    v: Tensor | None = None
    context: Tensor | None = None
    dropout_p: float = 0.0
    softmax: Softmax = PLAIN

    def but(self, **changes) -> AttentionInputs:
        """A copy with ``changes`` (``dataclasses.replace``): what a scheme hands on, e.g. other positions."""
        return replace(self, **changes)


def sinusoid_table(positions: Tensor, dim: int) -> Tensor:
    """PE(p) in the concatenated ``[sin ; cos]`` layout, used by every sinusoidal scheme.

    positions: [...] (any float/int tensor). Returns [..., dim] float32.
    PE(p)[k] = sin(p / 10000^{2k/dim}),  PE(p)[dim/2 + k] = cos(p / 10000^{2k/dim}).
    """
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim))
    angles = positions.to(torch.float32)[..., None] * inv_freq
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class ScoreBias:
    """An additive bias b_ij of the scaled scores, q_i . k_j / sqrt(d_h) + b_ij, in the two forms the attention
    paths read: ``dense`` for SDPA, ``score_mod`` for flex_attention (``fused.py``), which reads it per pair."""

    def dense(self, pos: Positions) -> Tensor:
        """The bias as a tensor broadcastable to [B, H, L, N]."""
        raise NotImplementedError

    def score_mod(self, pos: Positions, q: Tensor) -> Callable:
        """(s, b, h, i, j) -> s + b_ij, for flex_attention; q: [B, H, L, d_h] (its dtype and sizes)."""
        raise NotImplementedError


@dataclass
class DistanceBias(ScoreBias):
    """b_h(i - j), a function of the distance alone (ALiBi, T5, KERPLE, Sandwich). ``table``: distances [...]
    (integers >= 0) -> [H, ...]; SDPA reads it at every pair's distance, the fused path at the D + 1 distances
    of ``fused.distances`` and each pair at its column."""

    table: Callable[[Tensor], Tensor]

    def dense(self, pos: Positions) -> Tensor:
        return self.table(pos.distance.clamp(min=0))  # [H, L, N]; future keys (masked) at distance 0

    def score_mod(self, pos: Positions, q: Tensor) -> Callable:
        table, column = self.table(fused.distances(pos)).to(q.dtype), fused.column(pos)  # [H, D + 1]
        return lambda s, b, h, i, j: s + table[h, column(i, j)]


@dataclass
class PairBias(ScoreBias):
    """b_ij given for every pair: ``bias`` broadcastable to [B, H, L, N] (FIRE's [H, L, N]; a plain tensor from a
    scheme's ``score_bias`` is read as this)."""

    bias: Tensor

    def dense(self, pos: Positions) -> Tensor:
        return self.bias

    def score_mod(self, pos: Positions, q: Tensor) -> Callable:
        B, H, L, _ = q.shape
        bias = self.bias.to(q.dtype)
        bias = bias.view((1,) * (4 - bias.dim()) + bias.shape).expand(B, H, L, pos.visible.shape[1])
        return lambda s, b, h, i, j: s + bias[b, h, i, j]


@dataclass
class CumulativeBias(ScoreBias):
    """b_ij = C_i - C_j: a per-token term summed over the tokens j+1..i, given as its cumulative sum C over the
    keys (FoX: C = cumsum of the log forget gates). ``cumulative``: [B, H, N] (fp32: C grows along the keys, and
    only differences are used); query i sits at key column M + i. Dense it is [B, H, L, N]; the fused path reads
    two entries of C per pair and never builds it."""

    cumulative: Tensor

    def dense(self, pos: Positions) -> Tensor:
        C, M = self.cumulative, pos.visible.shape[1] - pos.visible.shape[0]
        return C[..., M:, None] - C[..., None, :]  # [B, H, L, N]: C_{M+i} - C_j

    def score_mod(self, pos: Positions, q: Tensor) -> Callable:
        C, M = self.cumulative, pos.visible.shape[1] - pos.visible.shape[0]
        return lambda s, b, h, i, j: s + (C[b, h, i + M] - C[b, h, j]).to(s.dtype)


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pos: Positions,
    bias: ScoreBias | None,
    dropout_p: float,
    softmax: Softmax = PLAIN,
):
    """softmax(lambda (q k^T / sqrt(d_h) + bias) + mask) v through SDPA; q: [B, H, L, d_h], k, v: [B, H, N, d_h];
    ``softmax``: lambda [H, L, 1] scales q and the bias (``softmax_scale.py``); a sink s_h is one more key, q . 0 = 0
    plus s_h in the mask, whose value is zero."""
    scale = softmax.scale
    if scale is not None:
        q = q * scale.to(q.dtype)  # lambda_i q_i . k_j: no [L, N] tensor
    if bias is None and softmax.sink is None:
        mask = pos.visible  # bool masks keep SDPA's fused kernels available
    else:
        mask = mask_to_bias(pos.visible, q.dtype)
        if bias is not None:
            dense = bias.dense(pos).to(q.dtype)
            mask = mask + (dense if scale is None else dense * scale.to(q.dtype))  # lambda_i b_ij
    if softmax.sink is not None:
        H, (L, N) = q.shape[1], pos.visible.shape
        mask = mask.expand(torch.broadcast_shapes(mask.shape, (H, L, N)))
        mask = torch.cat([mask, softmax.sink.to(q.dtype)[:, None, None].expand(*mask.shape[:-1], 1)], dim=-1)
        k, v = F.pad(k, (0, 0, 0, 1)), F.pad(v, (0, 0, 0, 1))  # the sink's key and value: zeros
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


def scaled_score_mod(score_mod: Callable, logit_scale: Tensor | None) -> Callable:
    """A flex score_mod (s, b, h, i, j) -> s + b_ij made lambda_hi (s + b_ij); logit_scale: [H, L, 1] or None."""
    if logit_scale is None:
        return score_mod
    return lambda s, b, h, i, j: score_mod(s, b, h, i, j) * logit_scale[h, i, 0].to(s.dtype)


class PositionalScheme(nn.Module):
    """Base class: no positional signal at all (causality alone), plain SDPA.

    Subclasses set ``name`` and register themselves with ``@register``.
    """

    name: str = "base"
    #: "absolute": positions are token indices added at the input (sinusoid, learned, global_sinusoid);
    #: "relative": positions enter the attention, as distances i - j (xl, rope, alibi, ...) or through what lies
    #: between the two tokens (cope's counts, fox's gates, stickbreaking's stick, path's transforms);
    #: "none": no positional signal (nope). Analysis and reports group schemes by this, never by name.
    kind: str = "none"
    #: The scheme's row in the table of schemes (docs/SCHEMES.md, rendered from the registry by docs/hooks.py): its
    #: family in a few words, where positions enter the computation (the equation), and what it does with memory.
    family: str = ""
    positions_enter: str = ""
    with_memory: str = ""
    #: auto | fused | unfused: the attention path of the relative schemes (``fused.py``); set by the model
    #: from ``model.attention_impl``.
    attention_impl: str = "auto"
    #: auto's choice on CUDA: the fused path once the attention has at least this many keys (M + L);
    #: None: auto keeps the unfused path. Set per scheme from the H200 measurements in docs/PERFORMANCE.md.
    fused_from_keys: int | None = None
    #: Why ``model.random_positions`` (Ruoss et al. 2023: positions an ordered random subset of [0, P), with
    #: gaps) does not apply to this scheme; None: it applies. The model refuses the option naming this reason.
    random_positions_refused: str | None = None
    #: Relative schemes: None if a score depends on its pair's content and distance i - j alone, so that the
    #: same content at the same distance scores the same wherever it sits (tests pin it); else why not.
    not_translation_invariant: str | None = None
    #: Why ``compile=true`` cannot serve this scheme (torch.compile would break its graph or recompile every
    #: segment); None: it compiles whole, one graph a segment length (tests/test_compile.py pins every scheme).
    #: Training and evaluation refuse the option naming this reason, before any compute.
    compile_refused: str | None = None
    #: Where ``compile=true`` was measured slower than eager (``posenc-lab bench --compile both``): what was
    #: measured, warned about when a run compiles this scheme; None: not measured slower.
    compile_slower: str | None = None
    #: Why this scheme cannot take the layers of a per-layer hybrid (``hybrid.py``); None: it can, unless it acts on
    #: the input embedding (``embed``), which the hybrid refuses for every scheme.
    hybrid_refused: str | None = None
    #: Why the model's changes to the softmax (``Softmax``: ``model.softmax_scale``, ``model.attention_sink``) do not
    #: apply to this scheme (its attention is no softmax); None: its ``attend`` and ``attention_probs`` take
    #: ``softmax``. ModelConfig refuses each option naming this reason.
    softmax_refused: str | None = None
    #: Parameters kept inside a range by projected gradient descent: name -> (low, high), high None for none.
    #: Read through ``constrained(name)``; ``project_parameters_`` clamps them all in place.
    projected: dict[str, tuple[float, float | None]] = {}
    #: True where the scheme's own ``attend`` only changes how positions enter (rope's STRING at evaluation), so that
    #: with its positions dropped (DroPE) what is left is plain attention.
    own_attend_is_positions: bool = False
    #: True for a scheme made of other schemes, one per group of layers, held in its ``parts`` (name -> scheme): a
    #: hybrid. DroPE checks and drops each part (drope.py) without knowing the hybrid.
    composite: bool = False

    def __init__(self, dims: Dims):
        super().__init__()
        self.dims = dims

    def constrained(self, name: str) -> Tensor:
        """The parameter ``name`` of ``projected``, inside its range (``project_``)."""
        return project_(getattr(self, name), *self.projected[name])

    def project_parameters_(self) -> None:
        """Clamp every ``projected`` parameter in place. The training step calls it before each forward, outside
        a compiled graph, where ``constrained`` cannot write (eager, ``constrained`` has already done it)."""
        for name, (low, high) in self.projected.items():
            project_(getattr(self, name), low, high)

    def at_step(self, step: int) -> None:
        """The optimizer steps the weights have taken: the model hands it over before and after every training step
        and from a loaded checkpoint. A scheme that changes during training reads it (DroPE, ``drope.py``)."""

    # -- 0. sizes and cost, asked by training, the benchmark and the sweeps ---------------------
    @classmethod
    def sized_options(cls, options: dict, segment_len: int, mem_len: int, max_offset: int = 0) -> dict:
        """``options`` with the length-dependent ones left ``None`` filled in for a run of these lengths
        (segment_len L, mem_len M, positions up to max_offset since an episode start). Default: as given."""
        return dict(options)

    def extra_flops(self, segment_len: int, mem_len: int, batch_size: int = 1) -> float:
        """Matmul FLOPs per layer and per stream that this scheme adds to one forward of a segment of
        L = segment_len queries over N = mem_len + L keys (a product shared by the ``batch_size`` streams is
        divided among them). Element-wise work (rotations, biases, table lookups) is not counted. Default: 0."""
        return 0.0

    # -- 0. validation, before any compute ---------------------------------------------------
    def validate(self, segment_len: int, mem_len: int, max_offset: int = 0) -> None:
        """Raise ValueError if this scheme cannot serve these lengths. Default: anything goes."""

    # -- 1. input --------------------------------------------------------------------------
    def embed(self, h: Tensor, pos: Positions) -> Tensor:
        """h: [B, L, D] token embeddings -> [B, L, D] layer-0 input. Default: unchanged."""
        return h

    # -- 2. scores -------------------------------------------------------------------------
    # context: [B, N, D] the layer's input over the N keys, [memory ; segment] (what k and v are projected from),
    # for schemes whose positions depend on the data; the model always passes it.
    def rotate(
        self, layer: int, q: Tensor, k: Tensor, pos: Positions, context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """q: [B, H, L, d_h], k: [B, H, N, d_h] -> the same, position-dependent. Default: unchanged."""
        return q, k

    def score_bias(self, layer: int, pos: Positions, context: Tensor | None = None) -> ScoreBias | Tensor | None:
        """The additive bias of the scaled scores (a ``ScoreBias``; a plain tensor broadcastable to [B, H, L, N]
        is read as a ``PairBias``), or None. Default: None."""
        return None

    def _bias(self, layer: int, pos: Positions, context: Tensor | None) -> ScoreBias | None:
        bias = self.score_bias(layer, pos, context)
        return PairBias(bias) if isinstance(bias, Tensor) else bias

    def attend(self, a: AttentionInputs) -> Tensor:
        """[B, H, L, d_h]: softmax(lambda (rotate(q) rotate(k)^T / sqrt(d_h) + bias) + mask) v, through flex_attention
        where the fused path runs (a bias and no sink, ``fused.use_fused``), else SDPA."""
        q, k = self.rotate(a.layer, a.q, a.k, a.pos, a.context)
        bias = self._bias(a.layer, a.pos, a.context)
        if bias is not None and a.softmax.sink is None and fused.use_fused(self, q, k, a.dropout_p):
            return fused.attend_bias(q, k, a.v, a.pos, scaled_score_mod(bias.score_mod(a.pos, q), a.softmax.scale))
        return sdpa_attention(q, k, a.v, a.pos, bias, a.dropout_p, a.softmax)

    def attention_probs(self, a: AttentionInputs) -> Tensor:
        """[B, H, L, N] attention probabilities, for analysis (where the model looks); with a sink a row sums to
        less than one. ``a.v`` and ``a.dropout_p`` are not read.

        Attending over one-hot values returns the probabilities themselves, so every scheme whose
        output is ``probs @ v`` gets this for free (through SDPA, never flex); schemes that add to the values
        override it.
        """
        B, H, _, _ = a.q.shape
        N = a.k.shape[2]
        one_hot = torch.eye(N, dtype=a.q.dtype, device=a.q.device).expand(B, H, N, N)
        q, k = self.rotate(a.layer, a.q, a.k, a.pos, a.context)
        return sdpa_attention(q, k, one_hot, a.pos, self._bias(a.layer, a.pos, a.context), 0.0, a.softmax)

    @classmethod
    def random_positions_problem(cls, options: dict, n_layer: int) -> str | None:
        """Why ``model.random_positions`` cannot serve this scheme built with ``options`` on ``n_layer`` layers, or
        None. Default: ``random_positions_refused``, whatever the options."""
        return cls.random_positions_refused

    def masked_positions(self, layer: int, pos: Positions) -> Positions:
        """The positions of layer ``layer`` with its own mask and no encoding (what a dropped encoding leaves: a
        hybrid's window stays). Default: ``pos``."""
        return pos

    def extra_repr(self) -> str:
        return f"name={self.name!r}"


class ExplicitScores(PositionalScheme):
    """A scheme that writes its scores itself (``scores``: scaled, SSMax's ``logit_scale`` applied, masked): its
    probabilities are their softmax (``Softmax.probs``: a sink included) and its output the values weighted by them
    (xl, cope)."""

    def scores(self, layer: int, q: Tensor, k: Tensor, pos: Positions, logit_scale: Tensor | None = None) -> Tensor:
        """q: [B, H, L, d_h], k: [B, H, N, d_h] -> [B, H, L, N] the scores, -inf where not visible."""
        raise NotImplementedError

    def attention_probs(self, a: AttentionInputs) -> Tensor:
        return a.softmax.probs(self.scores(a.layer, a.q, a.k, a.pos, a.softmax.scale))

    def attend(self, a: AttentionInputs) -> Tensor:
        probs = self.attention_probs(a)
        return (F.dropout(probs, a.dropout_p) if a.dropout_p > 0 else probs) @ a.v

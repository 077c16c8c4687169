"""The memory (segment-recurrent) transformer: a decoder-only LM with Transformer-XL recurrence.

Per layer n, with memory mem^{n-1} of the last M inputs that layer consumed (stop-gradient):

    h~ = [SG(mem^{n-1}) ; h^{n-1}]                  (M + L states)
    q = h^{n-1} W_q,   k = h~ W_k,   v = h~ W_v      (queries from the segment only)
    h^n = Block(h^{n-1}; q, k, v)                    (the scheme decides how positions enter)

The positional scheme is chosen by name (``ModelConfig.posenc``) and acts through one interface
(``posenc_lab.positional.PositionalScheme``). This file imports only torch and that package.

The defaults are a modern variant (pre-LayerNorm, GELU, no output bias, full softmax). The published
Transformer-XL is the same code with options (conf/model/txl_*.yaml): post-LayerNorm, ReLU, dropout
after the feed-forward's inner activation, on the position embeddings and on the final hidden state,
an output bias, the adaptive softmax for large vocabularies and the published same-length window.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .adaptive_softmax import AdaptiveSoftmax
from .data_positions import DataPositions, data_positions_problem
from .errors import shown
from .memory import Memory, Recurrence  # noqa: F401 (Recurrence: imported from here by callers)
from .positional import ATTENTION_IMPLS, SCHEMES, Dims, PositionalScheme, Positions, build_scheme
from .positional.base import PLAIN, AttentionInputs, PositionDropout, Softmax
from .sink_gate import AttentionSink, OutputGate, attention_sink_problem
from .softmax_scale import SSMax, softmax_scale_problem

FF_ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}
#: same_length windows: how many keys each query sees. "mem_len+1": itself and the mem_len states before
#: it (posenc-lab's default); "mem_len": itself and mem_len - 1 before it (the published code).
SAME_LENGTH_KEYS = ("mem_len+1", "mem_len")
INITS = ("gpt2", "published")


def int_problem(name: str, value, minimum: int) -> str | None:
    """Why ``value`` is not an integer >= minimum (named ``name``), or None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        return f"{name} must be an integer >= {minimum}, got {shown(value)}"
    return None


@dataclass
class ModelConfig:
    vocab_size: int = 256
    n_layer: int = 4
    d_model: int = 128
    n_head: int = 4
    d_inner: int = 512
    dropout: float = 0.1  # on the input embedding, the attention output and the feed-forward output
    attn_dropout: float = 0.0  # on the attention probabilities (the published "dropatt")
    ff_inner_dropout: float = 0.0  # after the feed-forward's inner activation (published: = dropout)
    pos_dropout: float = 0.0  # on a scheme's position embeddings, e.g. xl's R (published: = dropout)
    final_dropout: float = 0.0  # on the last layer's output, before the softmax (published: = dropout)
    ff_activation: str = "gelu"  # gelu | relu (published)
    output_bias: bool = False  # a bias per word in the output layer (published: true)
    adaptive_cutoffs: list[int] | None = None  # adaptive softmax cutoffs (WikiText-103: 20000 40000 200000)
    mem_len: int = 0  # M: states each layer keeps from earlier segments (0 = no recurrence)
    pre_norm: bool = True
    tie_weights: bool = True
    same_length: bool = False  # every query sees the same number of keys (see same_length_keys)
    same_length_keys: str = "mem_len+1"  # "mem_len+1" | "mem_len" (the published window, itself included)
    loss_recent_frac: float = 1.0  # train on the last fraction of the segment only (paper's half loss: 0.5)
    init: str = "gpt2"  # gpt2 | published (see MemoryTransformer.__init__)
    posenc: str = "xl"  # the default scheme
    posenc_kwargs: dict = field(default_factory=dict)
    # Randomized positions (Ruoss et al. 2023): P makes each segment's M + L keys take an ordered random subset of
    # [0, P), drawn anew every forward, training and evaluation alike (as the authors' code), the queries the last L
    # of them; null: the token indices -M..L-1. A scheme that reads no position index refuses it, saying why.
    random_positions: int | None = None
    attention_impl: str = "auto"  # auto | fused | unfused: flex_attention for relative schemes (positional/fused.py)
    # null: the plain softmax; ssmax: each logit times s_h log n_i, n_i the keys query i sees (softmax_scale.py)
    softmax_scale: str | None = None
    # a learned logit per head in the softmax's denominator, a key whose value is zero (sink_gate.py)
    attention_sink: bool = False
    # each head's output times sigmoid(x W_g), per channel, from the layer's input (Qiu et al. 2025; sink_gate.py)
    output_gate: bool = False
    # null | abacus | coupling: a learned embedding of the data's position ids of that kind (data_positions.py)
    data_positions: str | None = None
    data_positions_size: int = 256  # rows of its table: ids 0..size-1 (the authors' max_position, max_seq_length)

    def __post_init__(self) -> None:
        if self.adaptive_cutoffs is not None and not isinstance(self.adaptive_cutoffs, list):
            self.adaptive_cutoffs = list(self.adaptive_cutoffs)
        self.posenc_kwargs = dict(self.posenc_kwargs or {})
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def problems(self) -> list[str]:
        """Every invalid field, as ``model.<field> must be ..., got ...`` (the config check lists them all)."""
        out = []
        for name, minimum in [("vocab_size", 2), ("n_layer", 1), ("d_model", 1), ("n_head", 1), ("d_inner", 1)]:
            out.append(int_problem(f"model.{name}", getattr(self, name), minimum))
        out.append(int_problem("model.mem_len", self.mem_len, 0))
        if not any(out[1:4]) and self.d_model % self.n_head:
            out.append(
                f"model.n_head={self.n_head} does not divide model.d_model={self.d_model}; "
                f"pick n_head among the divisors of d_model"
            )
        for name in ("dropout", "attn_dropout", "ff_inner_dropout", "pos_dropout", "final_dropout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                out.append(f"model.{name} must be in [0, 1), got {value!r}")
        frac = self.loss_recent_frac
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0.0 < frac <= 1.0:
            out.append(f"model.loss_recent_frac must be in (0, 1], got {frac!r}")
        for name, valid in (
            ("ff_activation", sorted(FF_ACTIVATIONS)),
            ("init", list(INITS)),
            ("same_length_keys", list(SAME_LENGTH_KEYS)),
            ("attention_impl", list(ATTENTION_IMPLS)),
        ):
            if getattr(self, name) not in valid:
                out.append(f"model.{name} must be one of {', '.join(valid)}, got {getattr(self, name)!r}")
        for name in ("pre_norm", "tie_weights", "same_length", "output_bias", "output_gate"):
            if not isinstance(getattr(self, name), bool):
                out.append(f"model.{name} must be true or false, got {getattr(self, name)!r}")
        if self.same_length is True and self.mem_len == 0:
            out.append("model.same_length=true needs model.mem_len >= 1 (the window is mem_len keys)")
        if self.adaptive_cutoffs is not None:
            bounds = [0, *self.adaptive_cutoffs, self.vocab_size]
            if any(isinstance(c, bool) or not isinstance(c, int) for c in bounds) or any(
                b <= a for a, b in zip(bounds, bounds[1:])
            ):
                out.append(
                    f"model.adaptive_cutoffs must be integers increasing strictly within (0, vocab_size="
                    f"{self.vocab_size}), got {self.adaptive_cutoffs!r} (null: a full softmax)"
                )
        out.append(softmax_scale_problem(self.softmax_scale, self.posenc, self.posenc_kwargs))
        out.append(attention_sink_problem(self.attention_sink, self.posenc, self.posenc_kwargs))
        out.append(data_positions_problem(self.data_positions, self.data_positions_size))
        if self.random_positions is not None:
            if (problem := int_problem("model.random_positions", self.random_positions, 1)) is not None:
                out.append(problem)
            elif self.posenc in SCHEMES and (refused := self._random_positions_refused()):
                out.append(
                    f"model.random_positions={self.random_positions} does not apply to posenc={self.posenc}: "
                    f"{refused} (set model.random_positions=null)"  # no "; ": problems are joined by it
                )
        return [p for p in out if p]

    def _random_positions_refused(self) -> str | None:
        """Why the scheme reads no position (``random_positions_refused``); a hybrid's from the layers it builds."""
        return SCHEMES[self.posenc].random_positions_problem(self.posenc_kwargs, self.n_layer)

    @property
    def dims(self) -> Dims:
        return Dims(self.n_layer, self.d_model, self.n_head)

    def check_lengths(self, scheme: PositionalScheme, segment_len: int, mem_len: int, max_offset: int = 0) -> None:
        """ValueError, one line, if this model and ``scheme`` cannot serve these lengths, random positions included
        (the config check asks before anything is built, the model before each run)."""
        lengths = {"segment_len": (segment_len, 1), "mem_len": (mem_len, 0), "max_offset": (max_offset, 0)}
        if problem := next(filter(None, (int_problem(n, v, low) for n, (v, low) in lengths.items())), None):
            raise ValueError(problem)
        scheme.validate(segment_len, mem_len, max_offset)
        if self.random_positions is not None:
            self.check_random_positions(segment_len + mem_len)
            try:  # positions reach P - 1, as those of a segment of P tokens do
                scheme.validate(self.random_positions, 0, max_offset)
            except ValueError as e:
                raise ValueError(f"with model.random_positions={self.random_positions}: {e}") from e

    def check_random_positions(self, keys: int) -> None:
        if keys > (P := self.random_positions):
            raise ValueError(
                f"model.random_positions={P} is fewer than the {keys} keys of a segment (mem_len + segment_len), each "
                f"of which takes its own position in [0, random_positions); raise it to at least {keys}"
            )


@dataclass
class ModelOutput:
    hidden: Tensor  # [B, L, D] the input of the output layer
    mems: list[Tensor] | Memory  # n_layer x [B, M', D], detached; a Memory (static, M slots) if one was given
    token_loss: Tensor | None = None  # [B, L] nats
    loss: Tensor | None = None  # scalar: mean over counted tokens
    counted: Tensor | None = None  # [B, L] bool: the tokens the loss counts (loss_mask and the recent cut)
    attention: list[Tensor] | None = None  # n_layer x [B, H, L, N] when asked for
    scores: Callable[[Tensor], Tensor] | None = field(default=None, repr=False)  # hidden -> [B, L, V]
    _logits: Tensor | None = field(default=None, repr=False)

    @property
    def logits(self) -> Tensor:
        """[B, L, V] scores whose argmax is the prediction: the logits of a full softmax, the
        log-probabilities of an adaptive softmax (computed on first use: a full-vocabulary pass)."""
        if self._logits is None:
            self._logits = self.scores(self.hidden)
        return self._logits


class Block(nn.Module):
    """Attention + feed-forward, pre- or post-LayerNorm; positions come from the shared scheme."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        D = cfg.d_model
        self.n_head, self.pre_norm = cfg.n_head, cfg.pre_norm
        self.attn_dropout = cfg.attn_dropout
        self.ln_attn, self.ln_ff = nn.LayerNorm(D), nn.LayerNorm(D)
        self.q_proj = nn.Linear(D, D, bias=False)
        self.kv_proj = nn.Linear(D, 2 * D, bias=False)  # fused: one matmul for k and v
        self.out_proj = nn.Linear(D, D, bias=False)
        self.ff = nn.Sequential(
            nn.Linear(D, cfg.d_inner),
            FF_ACTIVATIONS[cfg.ff_activation](),
            nn.Dropout(cfg.ff_inner_dropout),
            nn.Linear(cfg.d_inner, D),
        )
        self.drop = nn.Dropout(cfg.dropout)
        self.ssmax = SSMax(cfg.n_head) if cfg.softmax_scale == "ssmax" else None  # s_h of this layer
        self.sink = AttentionSink(cfg.n_head) if cfg.attention_sink else None  # its sink's logit per head
        self.gate = OutputGate(D) if cfg.output_gate else None

    def attention(self, x: Tensor, context: Tensor, scheme, layer: int, pos: Positions, probs_out, memory_kv=None):
        """x: [B, L, D] the segment, context: [B, N, D] = [memory ; segment] -> [B, L, D]; memory_kv: [B, M, 2 D]
        the memory's keys and values (``memory_kv``), or None: all projected from the context here. The scheme gets
        the context too: a data-dependent one (FoX's gates, PaTH's transforms) projects it with its own parameters."""
        B, L, D = x.shape
        N, H = context.shape[1], self.n_head
        q = self.q_proj(x).view(B, L, H, D // H).transpose(1, 2)  # [B, H, L, d_h]
        if memory_kv is None:
            k, v = self.kv_proj(context).view(B, N, 2, H, D // H).permute(2, 0, 3, 1, 4)  # 2 x [B, H, N, d_h]
        else:  # [memory ; segment] along the keys, contiguous (the copy the schemes' GEMMs made of the strided view)
            kv = [t.view(B, -1, 2, H, D // H).permute(2, 0, 3, 1, 4) for t in (memory_kv, self.kv_proj(x))]
            k, v = (torch.cat([kv[0][i], kv[1][i]], dim=2) for i in (0, 1))
        dropout_p = self.attn_dropout if self.training else 0.0
        a = AttentionInputs(layer, q, k, pos, v=v, context=context, dropout_p=dropout_p, softmax=self.softmax(pos))
        if probs_out is not None:
            probs_out.append(scheme.attention_probs(a).detach())
        out = scheme.attend(a).transpose(1, 2).reshape(B, L, D)
        return self.out_proj(out if self.gate is None else out * self.gate(x).to(out.dtype))

    def softmax(self, pos: Positions) -> Softmax:
        """This layer's changes to the scheme's softmax: SSMax's s_h log n_i [H, L, 1], the sink's logits [H]."""
        if self.ssmax is None and self.sink is None:
            return PLAIN
        return Softmax(None if self.ssmax is None else self.ssmax(pos), None if self.sink is None else self.sink())

    def forward(self, x: Tensor, context: Tensor, scheme: PositionalScheme, layer: int, pos: Positions, probs_out=None):
        """x: [B, L, D] the segment, context: [B, M + L, D] = [memory ; x] -> [B, L, D]."""
        M = context.shape[1] - x.shape[1]
        if self.pre_norm and M == 0:
            normed = self.ln_attn(context)
            x = x + self.drop(self.attention(normed, normed, scheme, layer, pos, probs_out))
        elif self.pre_norm:
            memory_kv, normed_memory = self.memory_kv(context[:, :M].detach())
            normed = self.ln_attn(x)
            context = torch.cat([normed_memory, normed], dim=1)  # LN([memory ; x]), for a scheme that reads it
            x = x + self.drop(self.attention(normed, context, scheme, layer, pos, probs_out, memory_kv))
        else:
            memory_kv = self.kv_proj(context[:, :M].detach()) if M else None
            x = self.ln_attn(x + self.drop(self.attention(x, context, scheme, layer, pos, probs_out, memory_kv)))
            return self.ln_ff(x + self.drop(self.ff(x)))
        return x + self.drop(self.ff(self.ln_ff(x)))

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """memory: [B, M, D] (stop-gradient) -> ([B, M, 2 D] its keys and values, [B, M, D] its LayerNorm). LayerNorm's
        gamma, beta go into W: no gradient for the memory is computed (a GEMM of M rows and LN's backward, unused)."""
        ln, W = self.ln_attn, self.kv_proj.weight
        xhat = F.layer_norm(memory, ln.normalized_shape, eps=ln.eps)  # (m - mean) / std, no gain or bias
        with torch.autocast(memory.device.type, enabled=False):  # the weights' fold in fp32, cast once by F.linear
            Wg, b = W * ln.weight, W @ ln.bias
        kv = F.linear(xhat, Wg, b)  # (xhat gamma + beta) W^T = xhat (W diag gamma)^T + W beta
        return kv, torch.addcmul(ln.bias, xhat, ln.weight)  # LN(m) = xhat gamma + beta


class MemoryTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.scheme = build_scheme(cfg.posenc, cfg.dims, **cfg.posenc_kwargs)
        for module in self.scheme.modules():  # the scheme's position embeddings, if it has any
            if isinstance(module, PositionDropout):
                module.p = cfg.pos_dropout
        self.scheme.attention_impl = cfg.attention_impl
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.emb_scale = math.sqrt(cfg.d_model)
        kind = cfg.data_positions
        self.data_positions = None if kind is None else DataPositions(kind, cfg.data_positions_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_out = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()
        self.final_drop = nn.Dropout(cfg.final_dropout)
        if cfg.adaptive_cutoffs is None:
            self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=cfg.output_bias)
        else:
            self.head = AdaptiveSoftmax(
                cfg.d_model,
                cfg.vocab_size,
                cfg.adaptive_cutoffs,
                self.embedding.weight if cfg.tie_weights else None,
                bias=cfg.output_bias,
            )
        # Both inits: weights of linear maps and embeddings N(0, 0.02), biases 0. "gpt2" also scales the
        # residual projections by 1/sqrt(2 n_layer) and keeps each scheme's own init of its tables (u, v = 0).
        # "published" (the Transformer-XL code): LayerNorm gains N(1, 0.02) and every other parameter of
        # the scheme (u, v, tables) N(0, 0.02).
        self.apply(self._init_weights)
        if cfg.tie_weights and cfg.adaptive_cutoffs is None:
            self.head.weight = self.embedding.weight
        if cfg.init == "gpt2":
            for block in self.blocks:
                for proj in (block.out_proj, block.ff[-1]):
                    nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * cfg.n_layer))
        else:
            for module in self.modules():
                if isinstance(module, nn.LayerNorm):
                    nn.init.normal_(module.weight, 1.0, 0.02)
            for module in self.scheme.modules():
                if not isinstance(module, nn.Linear):
                    for param in module.parameters(recurse=False):
                        nn.init.normal_(param, 0.0, 0.02)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    @property
    def mem_len(self) -> int:
        """M of training (read-only: evaluation passes its own ``mem_len`` to ``forward``)."""
        return self.cfg.mem_len

    @property
    def same_length(self) -> bool:
        return self.cfg.same_length

    def at_step(self, step: int) -> None:
        """The optimizer steps the weights have taken, for a scheme that changes during training (DroPE); and the
        weights as they stand then, with every projected parameter back inside its range (``project_``)."""
        self.scheme.at_step(step)
        for module in self.modules():
            if isinstance(module, PositionalScheme):
                module.project_parameters_()

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def validate_lengths(self, segment_len: int, mem_len: int | None = None, max_offset: int = 0) -> None:
        """Fail before any compute if these lengths cannot work for this model (``ModelConfig.check_lengths``)."""
        self.cfg.check_lengths(self.scheme, segment_len, self.mem_len if mem_len is None else mem_len, max_offset)

    def positions(
        self,
        L: int,
        M: int,
        offset: Tensor,
        device: torch.device,
        mem_len: int | None = None,
        same_length: bool | None = None,
        valid: Tensor | None = None,
    ) -> Positions:
        """Queries at i = 0..L-1, keys at j = -M..L-1; key j visible to query i iff j <= i and, with
        same_length, i - j < W: W = mem_len + 1 keys ("mem_len+1") or W = mem_len ("mem_len", published).
        mem_len, same_length: None is the config's.

        With ``random_positions`` P the keys instead take M + L distinct positions drawn from [0, P), sorted
        (one draw per segment, shared by the streams and the layers): the memory keys the smallest M, so they stay
        before the queries and in order, the queries the largest L. Visibility still counts keys, not positions."""
        mem_len = self.cfg.mem_len if mem_len is None else mem_len
        q = torch.arange(L, device=device)
        k = torch.arange(-M, L, device=device)
        visible = k[None, :] <= q[:, None]
        if self.cfg.same_length if same_length is None else same_length:
            window = mem_len + (self.cfg.same_length_keys == "mem_len+1")
            visible &= k[None, :] > q[:, None] - window
        if valid is not None:
            visible &= valid[None, :]
        if self.cfg.random_positions is None:
            return Positions(q=q, k=k, offset=offset, visible=visible, valid=valid)
        self.cfg.check_random_positions(M + L)
        k = torch.randperm(self.cfg.random_positions, device=device)[: M + L].sort().values  # ordered subset of [0, P)
        return Positions(q=k[M:], k=k, offset=offset, visible=visible, consecutive=False, valid=valid)

    def empty_memory(self, batch: int, slots: int, device: torch.device) -> Memory:
        """A static memory of ``slots`` slots per layer, none valid: what a stream starts with."""
        D, dtype = self.cfg.d_model, self.embedding.weight.dtype
        return Memory.empty(self.cfg.n_layer, batch, slots, D, dtype, device)

    def scored(self, loss_mask: Tensor) -> Tensor:
        """[B, L] bool: the tokens the loss counts, ``loss_mask`` and, with ``loss_recent_frac`` < 1 (the
        paper's "half loss"), only the last ceil(frac * L) positions of the segment."""
        L = loss_mask.shape[1]
        recent = math.ceil(self.cfg.loss_recent_frac * L)
        if recent < L:
            loss_mask = loss_mask & (torch.arange(L, device=loss_mask.device) >= L - recent)
        return loss_mask

    def forward(
        self,
        tokens: Tensor,
        targets: Tensor | None = None,
        mems: list[Tensor] | Memory | None = None,
        offset: int | Tensor = 0,
        loss_mask: Tensor | None = None,
        return_attention: bool = False,
        mem_len: int | None = None,
        same_length: bool | None = None,
        position_ids: dict[str, Tensor] | None = None,
    ) -> ModelOutput:
        """tokens, targets: [B, L] int64; mems: n_layer x [B, M, D] (all valid) or None/[] (no memory yet), or a
        ``Memory`` (M slots, some maybe not yet valid: the static memory of ``Recurrence``; the output's is one too);
        offset: stream offset s of tokens[:, 0], int or [B]; loss_mask: [B, L] bool (True = counted);
        position_ids: {kind: [B, L] int}, the data's position ids of the tokens (``model.data_positions`` reads one).
        mem_len (states kept per layer for the next segment) and same_length: None is the config's;
        evaluation at other lengths passes its own."""
        mem_len = self.cfg.mem_len if mem_len is None else mem_len
        if (self.cfg.same_length if same_length is None else same_length) and mem_len < 1:
            raise ValueError("same_length=true needs mem_len >= 1 (each query sees mem_len + 1 keys)")
        B, L = tokens.shape
        memory = mems if isinstance(mems, Memory) else None
        mems = memory.states if memory is not None else (mems or [])
        if mems and (len(mems) != len(self.blocks) or mems[0].shape[0] != B):
            raise ValueError(
                f"memory holds {len(mems)} layers x batch {mems[0].shape[0]}, "
                f"the model has {len(self.blocks)} layers and this batch has {B} streams"
            )
        M = mems[0].shape[1] if mems else 0
        if not torch.is_tensor(offset):
            offset = torch.full((B,), int(offset), dtype=torch.long)
        valid = None if memory is None else F.pad(memory.valid, (0, L), value=True)  # [M + L] keys that exist
        pos = self.positions(L, M, offset.to(tokens.device), tokens.device, mem_len, same_length, valid)

        h = self.scheme.embed(self.embedding(tokens) * self.emb_scale, pos)
        if self.data_positions is not None:
            h = self.data_positions(h, position_ids, self.emb_scale)
        h = self.drop(h)  # h^0
        new_mems, attention = [], ([] if return_attention else None)
        for layer, block in enumerate(self.blocks):
            context = torch.cat([mems[layer].detach().to(h.dtype), h], dim=1) if mems else h  # h~ = [SG(mem) ; h]
            if mem_len > 0:  # this layer's inputs, newest last, at most mem_len, stop-gradient
                new_mems.append(context[:, -mem_len:].detach())
            h = block(h, context, self.scheme, layer, pos, attention)
        h = self.final_drop(self.ln_out(h))
        if memory is not None and new_mems:  # static: mem_len slots, padded in front with invalid ones if short
            short = max(mem_len - M - L, 0)
            new_mems = Memory([F.pad(m, (0, 0, short, 0)) for m in new_mems], F.pad(valid[-mem_len:], (short, 0)))

        adaptive = isinstance(self.head, AdaptiveSoftmax)
        out = ModelOutput(
            hidden=h, mems=new_mems, attention=attention, scores=self.head.log_probs if adaptive else self.head
        )
        if targets is not None:
            if adaptive:  # tail words are scored only where a target lies in that tail
                out.token_loss = self.head.token_nll(h, targets)
            else:
                logits = out.logits
                out.token_loss = F.cross_entropy(
                    logits.float().view(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
                ).view(B, L)
            out.counted = self.scored(
                torch.ones_like(targets, dtype=torch.bool) if loss_mask is None else loss_mask.bool()
            )
            out.loss = (out.token_loss * out.counted).sum() / out.counted.sum().clamp(min=1)
        return out

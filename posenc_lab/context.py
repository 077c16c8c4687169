"""Per-token evaluation at a controlled context: ordered streams with memory, the "same length"
attention mask, and sliding windows. Public functions for the analysis (``analysis/`` imports them;
nothing here imports ``analysis``). Imports only numpy, torch and the model.

Three ways to run a trained model over token rows ``tokens [B, N + 1]`` (inputs ``tokens[:, :-1]``,
targets ``tokens[:, 1:]``):

- ``stream_losses``: segments of ``segment_len`` in order, each layer carrying ``mem_len`` states
  (0: every segment alone), optionally the same-length mask; memory and offset reset every
  ``episode_len`` tokens. The way the model was trained, at any lengths.
- ``context_losses(mode="memory")``: every scored token sees exactly ``c`` previous tokens through
  memory ``M' = c`` and the same-length mask (query i attends to keys i-c..i in every layer).
- ``context_losses(mode="window")``: every scored token is the last of a fresh window of ``c + 1``
  tokens, no memory (the vanilla Transformer's sliding-window evaluation); ``window_losses`` does it for
  many c from one causal pass per window start.
- ``perturbed_losses``: the rows run as trained (``stream_losses``) with the inputs beyond distance d of a scored
  block replaced by other text (Sun et al. 2021; Khandelwal et al. 2018): what the far context is worth.

Lengths a scheme cannot serve raise ``ValueError`` from ``model.validate_lengths`` before any compute.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .data import segment_schedule
from .model import MemoryTransformer, ModelOutput, Recurrence

CONTEXT_MODES = ("memory", "window")


@dataclass
class StreamResult:
    """Per-target results of one evaluation, all [B, N] (N = targets evaluated)."""

    loss: Tensor  # nats
    correct: Tensor  # bool: argmax of the logits == target
    offset: Tensor  # long: stream offset (since the episode began) of the input token of each target
    predicted: Tensor | None = None  # long: argmax of the logits (kept by ``stream_losses``)


@contextmanager
def evaluating(model: MemoryTransformer):
    """The model in eval mode (no dropout) for the block, its previous mode restored after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def _as_rows(tokens) -> Tensor:
    tokens = torch.as_tensor(tokens)
    if tokens.dim() == 1:
        tokens = tokens[None]
    if tokens.dim() != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be [B, N + 1] with N >= 1, got shape {tuple(tokens.shape)}")
    return tokens.long()


def iter_stream(
    model: MemoryTransformer,
    tokens,
    *,
    segment_len: int,
    mem_len: int,
    same_length: bool = False,
    episode_len: int | None = None,
    start_offset: int = 0,
    return_attention: bool = False,
    position_ids=None,
):
    """Run ``tokens [B, N + 1]`` through the model in order; yield ``(start, offsets, output)`` per segment.
    ``position_ids``: {kind: [B, N + 1] int}, the data's position ids of the tokens (``model.data_positions``).

    ``start``: index of the segment's first input in the row; ``offsets``: [L] stream offsets of its
    inputs; ``output``: the ModelOutput (targets given, so ``token_loss`` is set). Memory (``mem_len``
    states per layer) and offsets reset at the start and every ``episode_len`` tokens;
    ``start_offset`` is the offset of the first token (as if the row began mid-episode). The segments are
    cut by ``data.segment_schedule`` and the memory carried by ``model.Recurrence``, as in training.
    """
    tokens = _as_rows(tokens)
    N = tokens.shape[1] - 1
    T = episode_len
    if T is not None and T < 1:
        raise ValueError(f"episode_len must be None or >= 1, got {T}")
    largest = (min(T, N + start_offset) if T else N + start_offset) - 1
    model.validate_lengths(min(segment_len, N), mem_len, max_offset=max(largest, 0))
    device = next(model.parameters()).device
    same_length = bool(same_length and mem_len > 0)
    memory = Recurrence()
    with evaluating(model), torch.inference_mode():
        for pos, length, offset, reset in segment_schedule(N, segment_len, T, start_offset=start_offset):
            x = tokens[:, pos : pos + length].to(device)
            y = tokens[:, pos + 1 : pos + length + 1].to(device)
            ids = {k: _as_rows(a)[:, pos : pos + length].to(device) for k, a in (position_ids or {}).items()}
            out: ModelOutput = memory.step(
                model,
                x,
                y,
                reset=reset,
                offset=offset,
                return_attention=return_attention,
                mem_len=mem_len,
                same_length=same_length,
                position_ids=ids or None,
            )
            yield pos, torch.arange(offset, offset + length), out


def stream_losses(
    model: MemoryTransformer,
    tokens,
    *,
    segment_len: int,
    mem_len: int,
    same_length: bool = False,
    episode_len: int | None = None,
    start_offset: int = 0,
    position_ids=None,
) -> StreamResult:
    """Per-target loss, correctness, offset and prediction of ``tokens [B, N + 1]`` run as an ordered stream
    (``position_ids``: as ``iter_stream``'s)."""
    losses, correct, predicted, offsets = [], [], [], []
    tokens = _as_rows(tokens)
    for pos, offs, out in iter_stream(
        model,
        tokens,
        segment_len=segment_len,
        mem_len=mem_len,
        same_length=same_length,
        episode_len=episode_len,
        start_offset=start_offset,
        position_ids=position_ids,
    ):
        L = offs.numel()
        losses.append(out.token_loss.float().cpu())
        predicted.append(out.logits.argmax(-1).cpu())
        correct.append(predicted[-1] == tokens[:, pos + 1 : pos + L + 1])
        offsets.append(offs)
    B = tokens.shape[0]
    offset = torch.cat(offsets).expand(B, -1).clone()
    return StreamResult(torch.cat(losses, 1), torch.cat(correct, 1), offset, torch.cat(predicted, 1))


def context_losses(
    model: MemoryTransformer,
    tokens,
    c: int,
    *,
    score_start: int,
    n_score: int,
    mode: str = "memory",
    segment_len: int = 128,
    window_batch_tokens: int = 65536,
) -> StreamResult:
    """Loss of the targets at ``tokens[:, score_start + 1 : score_start + n_score + 1]`` where the
    input of every scored target sees exactly ``c`` previous tokens (``c <= score_start``).

    mode "memory": memory M' = c with the same-length mask, segments of ``segment_len`` fed from
    ``score_start - c`` (offset 0 there), so every scored query attends to keys i-c..i in every layer
    (deeper layers carry older information through the memory: that is recurrence).
    mode "window": each scored target is predicted from a fresh window of its c + 1 inputs
    (positions 0..c, offset 0, no memory): nothing older than c tokens can reach it.
    """
    tokens = _as_rows(tokens)
    if mode not in CONTEXT_MODES:
        raise ValueError(f"context mode must be one of {CONTEXT_MODES}, got {mode!r}")
    if isinstance(c, bool) or not isinstance(c, int) or c < 1:
        raise ValueError(f"context length c must be an integer >= 1, got {c!r}")
    if c > score_start:
        raise ValueError(
            f"context length {c} needs score_start >= {c} (tokens before the first scored one), got {score_start}"
        )
    if n_score < 1 or score_start + n_score + 1 > tokens.shape[1]:
        raise ValueError(
            f"need 1 <= n_score and score_start + n_score + 1 <= {tokens.shape[1]} tokens per row, "
            f"got score_start {score_start}, n_score {n_score}"
        )
    if mode == "memory":
        feed = tokens[:, score_start - c : score_start + n_score + 1]
        res = stream_losses(model, feed, segment_len=segment_len, mem_len=c, same_length=True)
        return StreamResult(res.loss[:, c:], res.correct[:, c:], res.offset[:, c:])

    return window_losses(
        model, tokens, [c], score_start=score_start, n_score=n_score, window_batch_tokens=window_batch_tokens
    )[c]


def window_losses(
    model: MemoryTransformer,
    tokens,
    contexts,
    *,
    score_start: int,
    n_score: int,
    window_batch_tokens: int = 65536,
) -> dict[int, StreamResult]:
    """``context_losses(mode="window")`` at every c of ``contexts`` at once: {c: result}.

    The window of the scored input i at context c is inputs i-c..i at positions 0..c. One causal pass over
    the C + 1 inputs that start at s = i - c (C = max(contexts)) computes exactly that window at its
    position c, since causal attention keeps the later inputs from reaching it; so one pass per start
    serves every (i, c) with i - c = s. That is n_score + C - min(contexts) windows of C + 1 inputs per row,
    instead of one window of c + 1 per scored input and c.
    """
    tokens = _as_rows(tokens)
    contexts = sorted({int(c) for c in contexts})
    if not contexts or contexts[0] < 1:
        raise ValueError(f"context lengths must be integers >= 1, got {contexts}")
    C, c_min = contexts[-1], contexts[0]
    if C > score_start or n_score < 1 or score_start + n_score + 1 > tokens.shape[1]:
        raise ValueError(
            f"need max(contexts) {C} <= score_start {score_start}, 1 <= n_score {n_score} and "
            f"score_start + n_score + 1 <= {tokens.shape[1]} tokens per row"
        )
    model.validate_lengths(C + 1, 0, max_offset=C)
    B, last = tokens.shape[0], tokens.shape[1] - 1
    starts = torch.arange(score_start - C, score_start + n_score - c_min)  # every start some (i, c) needs
    # C + 1 inputs and their targets per start; past the row's end the index is clamped: those inputs come
    # after every position read, so they change nothing
    idx = (starts[:, None] + torch.arange(C + 2)).clamp(max=last)
    windows = tokens[:, idx].reshape(B * len(starts), C + 2)
    chunk = max(1, window_batch_tokens // (C + 1))
    device = next(model.parameters()).device
    loss, correct = [], []
    with evaluating(model), torch.inference_mode():
        for w in windows.split(chunk):
            w = w.to(device)
            out = model(w[:, :-1], w[:, 1:], mems=None, offset=0, mem_len=0, same_length=False)
            loss.append(out.token_loss.float().cpu())
            correct.append((out.logits.argmax(-1) == w[:, 1:]).cpu())
    loss_all = torch.cat(loss).view(B, len(starts), C + 1)  # [B, start, position]
    correct_all = torch.cat(correct).view(B, len(starts), C + 1)
    results: dict[int, StreamResult] = {}
    for c in contexts:
        rows = slice(C - c, C - c + n_score)  # the start of scored input score_start + k is k + C - c rows in
        results[c] = StreamResult(
            loss_all[:, rows, c].clone(),
            correct_all[:, rows, c].clone(),
            torch.full((B, n_score), c, dtype=torch.long),
        )
    return results


def perturbed_losses(
    model: MemoryTransformer,
    tokens,
    replacement,
    distances,
    *,
    score_start: int,
    segment_len: int,
    mem_len: int,
    episode_len: int | None = None,
    batch_tokens: int = 65536,
) -> tuple[Tensor, dict[int, Tensor]]:
    """(true [B, n], {d: perturbed [B, n]}): the losses of the targets ``tokens[:, score_start + 1:]`` (the inputs
    from ``score_start`` on, n of them), the rows ``tokens [B, N + 1]`` run as an ordered stream with the
    training's segments, memory and episodes (``stream_losses``, the ``Recurrence`` step), and again with every
    input before ``score_start - d`` taken from ``replacement [B, N + 1]`` (the same positions of other text):
    the memory of the scored block is then built from the replaced text. The scored input at ``score_start + k``
    keeps its nearest d + k + 1 inputs (itself included) true, so use(d) = perturbed - true is what the inputs
    beyond at least d tokens are worth to it; d = 0 replaces everything before the block (a memory from other text).

    Cost: (1 + len(distances)) rows of N inputs per scored row, all run as one batch of streams (split into
    batches of about ``batch_tokens`` tokens): one ordered pass per (row, d), the whole row each time, since the
    memory carries everything before the block. ValueError for a d outside 0..score_start."""
    tokens, replacement = _as_rows(tokens), _as_rows(replacement)
    if replacement.shape != tokens.shape:
        raise ValueError(
            f"replacement must have the shape of tokens {tuple(tokens.shape)}, got {tuple(replacement.shape)}"
        )
    distances = [int(d) for d in distances]
    if bad := [d for d in distances if not 0 <= d <= score_start]:
        raise ValueError(f"distances must be in 0..score_start ({score_start}), got {bad}")
    if not 0 <= score_start < tokens.shape[1] - 1:
        raise ValueError(
            f"score_start must leave a target: 0 <= score_start < {tokens.shape[1] - 1}, got {score_start}"
        )
    B, width = tokens.shape
    variants = [tokens]
    for d in distances:
        mixed = tokens.clone()
        mixed[:, : score_start - d] = replacement[:, : score_start - d]
        variants.append(mixed)
    rows = torch.cat(variants)  # [(1 + n_d) B, N + 1]: variant v of row b is row v B + b
    per_batch = max(1, batch_tokens // width)
    loss = torch.cat(
        [
            stream_losses(model, chunk, segment_len=segment_len, mem_len=mem_len, episode_len=episode_len).loss
            for chunk in rows.split(per_batch)
        ]
    )[:, score_start:]
    return loss[:B], {d: loss[(i + 1) * B : (i + 2) * B] for i, d in enumerate(distances)}


def reads_offsets(model: MemoryTransformer) -> bool:
    """Whether the model's outputs depend on the stream offset (positions counted since the episode began, as
    ``global_sinusoid``'s): then a window whose positions pass the training episodes meets positions training
    never showed it. One forward of a few tokens at two offsets (schemes are told apart by behaviour, not name)."""
    device = next(model.parameters()).device
    x = torch.arange(4, device=device)[None] % model.cfg.vocab_size
    with evaluating(model), torch.inference_mode():
        a = model(x, mems=None, offset=0, mem_len=0, same_length=False).logits
        b = model(x, mems=None, offset=7, mem_len=0, same_length=False).logits
    return not torch.allclose(a, b, rtol=0, atol=1e-5)


def stream_rows(data, n_rows: int, row_len: int, start: int = 0) -> Tensor:
    """``n_rows`` contiguous, non-overlapping rows of ``row_len + 1`` tokens from a 1-D token array
    (the same layout as the ordered iterator: row b starts at ``start + b * stride``)."""
    n = len(data) - start
    stride = (n - 1) // n_rows
    if stride < row_len:
        raise ValueError(
            f"the split has {len(data):,} tokens: too few for {n_rows} rows of {row_len + 1} "
            f"(need {start + n_rows * row_len + 1:,}); use fewer rows or shorter ones"
        )
    idx = start + np.arange(n_rows)[:, None] * stride + np.arange(row_len + 1)[None, :]
    return torch.from_numpy(np.asarray(data)[idx].astype(np.int64))


__all__ = [
    "CONTEXT_MODES",
    "StreamResult",
    "context_losses",
    "reads_offsets",
    "evaluating",
    "iter_stream",
    "perturbed_losses",
    "stream_losses",
    "stream_rows",
    "window_losses",
]

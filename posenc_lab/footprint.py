"""What a run needs in memory, estimated from its sizes alone, and what the machine has: a size that cannot fit is
refused in one line before anything is built, loaded or written (``train_problem``, which ``checks.problems`` asks for
train, sweeps and ablate; ``fit_problem``, which ``evaluate``, ``bench`` and ``compare`` ask for theirs).

Nothing is built to estimate: no model and no tensor. The parameters are counted from ``ModelConfig``'s sizes, the
scheme's by building it on PyTorch's ``meta`` device (shapes without storage). Every figure is float32 (4 bytes): the
weights, the optimizer's state and the memory are float32 under every precision, and counting the activations in
float32 bounds a bf16-mixed run's from above.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from .model import ModelConfig
from .positional import SCHEMES, PositionalScheme, build_scheme

FLOAT = 4  # bytes of a float32
# Python objects one layer costs beside its tensors (its modules, their optimizer entries, a step's autograd nodes):
# 15-40 KB measured for a Block with its scheme; a model of millions of layers is refused on these alone.
LAYER_OVERHEAD = 64 * 1024
# Tensors a layer keeps for the backward pass, in units of the shapes named in ``activations``' docstring.
PER_TOKEN_D = 12  # [B, L, D]: LayerNorms' inputs and outputs, q, the attention's output and projection, dropout masks
PER_KEY_D = 5  # [B, N, D]: the normed context, k and v (and the memory's), their concatenations
# [B, H, L, N]: a scheme that adds to the logits (or attends its own way) keeps its term, the logits and the
# probabilities, and two more with attention dropout (its mask, the dropped probabilities); one without (rope, nope,
# the absolute schemes) goes through SDPA's kernels, which keep at most one. Calibrated on measured steps: xl, t5,
# alibi, shaw, fox, stickbreaking and rope stay below the estimate (tests/test_footprint.py).
PER_SCORE, PER_SCORE_DROPOUT, PER_SCORE_SDPA = 3, 2, 1
# An adaptive softmax scores a tail's words only for the tokens whose target lies in it: a word vocabulary's tails
# (past its first cutoff, the frequent words) hold about a tenth of its tokens, not all of them.
TAIL_SHARE = 0.1
PER_TOKEN_F = 3  # [B, L, F]: the feed-forward's inner layer before and after its activation, its dropout


@dataclass(frozen=True)
class Shape:
    """One step: ``batch`` streams (on one process) of ``segment_len`` tokens, with ``mem_len`` memory slots."""

    batch: int
    segment_len: int
    mem_len: int


def scheme_parameters(cfg: ModelConfig) -> int:
    """The parameters of ``cfg``'s positional scheme, built on the meta device (no storage); 0 if it cannot be built
    (the scheme's own check names why)."""
    try:
        with torch.device("meta"):
            scheme = build_scheme(cfg.posenc, cfg.dims, **cfg.posenc_kwargs)
    except Exception:  # noqa: BLE001 - a scheme that refuses its options is named by its own check
        return 0
    return sum(p.numel() for p in scheme.parameters())


def model_parameters(cfg: ModelConfig) -> int:
    """The parameters of ``MemoryTransformer(cfg)`` but its scheme's: the embedding, each layer's LayerNorms,
    projections, feed-forward, SSMax scales, sink logits and output gate, the final LayerNorm and the output layer
    (tied or not, adaptive or not)."""
    V, D, F, H = cfg.vocab_size, cfg.d_model, cfg.d_inner, cfg.n_head
    layer = 4 * D + 4 * D * D + (D * F + F) + (F * D + D) + (H if cfg.softmax_scale == "ssmax" else 0)
    layer += (H if cfg.attention_sink else 0) + (D * D if cfg.output_gate else 0)  # sink logits, the gate's W_g
    head = (0 if cfg.tie_weights else V * D) + (V if cfg.output_bias else 0)  # its own matrix unless tied, a bias
    head += len(cfg.adaptive_cutoffs or []) * (D + 1)  # an adaptive softmax's cluster row and bias a tail
    return V * D + cfg.n_layer * layer + (2 * D if cfg.pre_norm else 0) + head


def holds_scores(scheme: str) -> bool:
    """Whether ``scheme`` keeps [B, H, L, N] tensors of its own: it adds a term to the logits (``score_bias``) or
    attends its own way (``attend``); an unknown one is taken to."""
    cls = SCHEMES.get(scheme)
    return cls is None or cls.score_bias is not PositionalScheme.score_bias or cls.attend is not PositionalScheme.attend


def activations(cfg: ModelConfig, shape: Shape, train: bool) -> int:
    """Bytes of the tensors one step holds at its peak, for ``shape`` (B streams, L tokens, M slots; N = M + L keys).

    Training keeps every layer's tensors for the backward pass: per layer ``PER_TOKEN_D`` x [B, L, D],
    ``PER_KEY_D`` x [B, N, D], ``PER_SCORE`` x [B, H, L, N] attention scores (see there) and ``PER_TOKEN_F`` x
    [B, L, F]; plus the output layer's scores three times (logits, their softmax, its gradient: [B, L, V] for a full
    softmax, the head and ``TAIL_SHARE`` of the tails for an adaptive one) and one more layer's worth for the
    gradients in flight. Evaluation keeps no graph: one layer's tensors at a time, and the output layer's scores twice
    (a full-vocabulary pass). Randomized positions draw a permutation of [0, P) each forward (8 P bytes)."""
    B, L, M = shape.batch, shape.segment_len, shape.mem_len
    N, D, F, H, V = M + L, cfg.d_model, cfg.d_inner, cfg.n_head, cfg.vocab_size
    per_score = (
        PER_SCORE + (PER_SCORE_DROPOUT if cfg.attn_dropout else 0) if holds_scores(cfg.posenc) else PER_SCORE_SDPA
    )
    layer = B * (PER_TOKEN_D * L * D + PER_KEY_D * N * D + per_score * H * L * N + PER_TOKEN_F * L * F)
    if cfg.adaptive_cutoffs is not None and train:  # the head for every token, the tails for those they score
        scores = cfg.adaptive_cutoffs[0] + len(cfg.adaptive_cutoffs) + TAIL_SHARE * (V - cfg.adaptive_cutoffs[0])
    else:
        scores = V
    drawn = 8 * (cfg.random_positions or 0)  # randomized positions: a permutation of [0, P) in int64 every forward
    if train:
        return FLOAT * ((cfg.n_layer + 1) * layer + int(3 * B * L * scores)) + drawn
    return FLOAT * (layer + 2 * B * L * scores) + drawn


@dataclass(frozen=True)
class Need:
    """Bytes by part (weights, gradients and AdamW state, memory, activations, layer objects) and the parameters,
    the scheme's among them."""

    parts: dict[str, int]
    parameters: int
    scheme_parameters: int = 0

    @property
    def total(self) -> int:
        return sum(self.parts.values())


# The sizes a command's options set, by role, at their least (``fit_problem`` names the options that could make a run
# fit): the model's own fields, and the lengths and streams of its steps (``eval_batch``: the evaluation's alone).
MODEL_SIZES = ("n_layer", "d_model", "n_head", "d_inner", "random_positions")
LEAST = {"n_layer": 1, "d_model": 1, "n_head": 1, "d_inner": 1, "random_positions": None}
LEAST |= {"mem_len": 0, "segment_len": 1, "batch": 1, "eval_batch": 1}


def _at_least(cfg: ModelConfig, train: Shape | None, evals: Sequence[Shape], role: str, separate_eval: bool):
    """(cfg, train, evals) with the size of ``role`` at its least (``LEAST``); ``cfg`` copied, not validated again."""
    least = LEAST[role]
    if role in MODEL_SIZES:
        cfg = copy.copy(cfg)
        setattr(cfg, role, least)
        return cfg, train, evals
    field = "batch" if role == "eval_batch" else role
    if train is not None and role != "eval_batch":
        train = replace(train, **{field: least})
    if role != "batch" or not separate_eval:
        evals = [replace(s, **{field: least}) for s in evals]
    return cfg, train, evals


def need(cfg: ModelConfig, train: Shape | None, evals: Sequence[Shape] = (), scheme: bool = True) -> Need:
    """What a process needs for ``cfg``: its weights; with ``train`` (a training step's shape) their gradients and
    AdamW's two moments; every memory that is live at once (training's, twice while a step makes the next one, and
    each evaluation's, one for each of ``evals``); the largest step's activations (``activations``); and the layers'
    Python objects (``LAYER_OVERHEAD``). An approximate upper bound: the tensors named, in float32. ``scheme``:
    count the scheme's parameters too (``scheme_parameters``, which builds it on the meta device)."""
    in_scheme = scheme_parameters(cfg) if scheme else 0
    n_params = model_parameters(cfg) + in_scheme
    slots = sum(s.batch * s.mem_len for s in evals) + (2 * train.batch * train.mem_len if train else 0)
    steps = [activations(cfg, s, False) for s in evals] + ([activations(cfg, train, True)] if train else [])
    parts = {
        "weights": FLOAT * n_params,
        "gradients and AdamW state": 3 * FLOAT * n_params if train else 0,
        "memory": FLOAT * slots * cfg.n_layer * cfg.d_model,
        "activations": max(steps, default=0),
        "layer objects": LAYER_OVERHEAD * cfg.n_layer,
    }
    return Need({k: v for k, v in parts.items() if v}, n_params, in_scheme)


def size_text(n: int | float) -> str:
    """Bytes in decimal units, e.g. ``409.6 GB``."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"):
        if abs(n) < 1000 or unit == "YB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} YB"


def _cgroup_room() -> int | None:
    """What the cgroup (v2) this process runs in may still take, if it is limited."""
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        used = int((root / "memory.current").read_text())
    except (OSError, ValueError):
        return None
    return int(limit) - used if limit.isdigit() else None


_READ: dict[str, float] = {}  # the last reading of the RAM and when: a grid's checks quote one figure
READ_FOR_S = 60.0


def available_ram() -> int:
    """Bytes of RAM this process can still take: MemAvailable of /proc/meminfo (else os.sysconf's free pages),
    capped by its cgroup's limit; read again after ``READ_FOR_S`` seconds."""
    if time.monotonic() - _READ.get("at", -READ_FOR_S) < READ_FOR_S:
        return int(_READ["bytes"])
    have = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                have = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if have is None:
        have = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    room = _cgroup_room()
    have = have if room is None else min(have, room)
    _READ.update(at=time.monotonic(), bytes=have)
    return have


def available(device: str) -> tuple[int, str] | None:
    """(bytes, words) of what ``device`` ("cpu", "cuda", "cuda:N") has free; None where it cannot be told (a device
    this machine lacks: the trainer names that). CUDA is asked only for a CUDA device."""
    if not device.startswith("cuda"):
        return available_ram(), "the CPU has {} of RAM available"
    if not torch.cuda.is_available():
        return None
    index = torch.device(device).index or 0
    if index >= torch.cuda.device_count():
        return None
    free, _ = torch.cuda.mem_get_info(index)
    return free, f"cuda:{index} has {{}} free"


def fit_problem(
    cfg: ModelConfig,
    train: Shape | None,
    evals: Sequence[Shape],
    device: str,
    options: Mapping[str, tuple[str, object]],
    processes: int = 1,
    what: str = "this run",
) -> str | None:
    """One line if ``processes`` x ``need(cfg, train, evals)`` exceeds what ``device`` has free, else None: the need
    by part, what the machine has, and the options to lower (``options``: role of ``LEAST`` -> (this command's
    option, its value)): those each of which, at its least, would make the run fit; else the fewest that would
    together. The scheme is built on the meta device only once the rest fits (a million layers' objects are refused
    before they are made)."""
    have = available(device)
    if have is None:
        return None
    needed = need(cfg, train, evals, scheme=False)
    if processes * needed.total <= have[0]:
        needed = need(cfg, train, evals)
        if processes * needed.total <= have[0]:
            return None
    scheme_bytes = FLOAT * needed.scheme_parameters * (4 if train is not None else 1)
    separate = "eval_batch" in options
    at_least = {r: need(*_at_least(cfg, train, evals, r, separate), scheme=False).total + scheme_bytes for r in options}
    ranked = sorted(at_least, key=at_least.get)
    lower = [r for r in ranked if processes * at_least[r] <= have[0]]
    lower += ["posenc"] if processes * (needed.total - scheme_bytes) <= have[0] else []  # its parameters alone
    if not (
        alone := bool(lower)
    ):  # no one option can: the fewest that can together, each the one that saves the most of what is left
        sizes, left = (cfg, train, evals), [r for r in ranked if at_least[r] < needed.total]
        while left and processes * (need(*sizes, scheme=False).total + scheme_bytes) > have[0]:
            best = min(left, key=lambda r: need(*_at_least(*sizes, r, separate), scheme=False).total)
            sizes, lower = _at_least(*sizes, best, separate), [*lower, best]
            left.remove(best)
        lower += ["posenc"] if 2 * needed.scheme_parameters > needed.parameters else []
    scheme = f"posenc={cfg.posenc}'s options (its {needed.scheme_parameters:,} parameters)"
    lower = list(dict.fromkeys(scheme if r == "posenc" else f"{options[r][0]}={options[r][1]}" for r in lower))
    parts = ", ".join(f"{k} {size_text(processes * v)}" for k, v in needed.parts.items())
    each = f" ({processes} processes, each {size_text(needed.total)})" if processes > 1 else ""
    joined = " or ".join([", ".join(lower[:-1]), lower[-1]]) if len(lower) > 1 else "".join(lower)
    joined = joined if alone else joined.replace(" or ", " and ")
    advice = f"lower {joined}" if lower else "no option of this command can make it fit"
    return (
        f"{what} needs about {size_text(processes * needed.total)} of memory{each} ({parts}; {needed.parameters:,} "
        f"parameters; estimated by posenc_lab/footprint.py), but {have[1].format(size_text(have[0]))}: {advice}"
    )


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _mapping(cfg: DictConfig, key: str) -> dict:
    """The node at ``key`` resolved, or {} where it is no mapping or cannot resolve (the validator names why)."""
    try:
        node = OmegaConf.select(cfg, key, default=None)
        node = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    except Exception:  # noqa: BLE001 - an interpolation that cannot resolve is named by the validator
        return {}
    return node if isinstance(node, dict) else {}


def _device(accelerator: Any, devices: Any) -> str:
    """Where the trainer's ``accelerator`` puts the model ("cpu", "cuda:N"), asking CUDA only when it may be a GPU."""
    if accelerator in ("gpu", "cuda") or accelerator == "auto" and torch.cuda.is_available():
        first = devices[0] if isinstance(devices, (list, tuple)) and devices else 0
        return f"cuda:{first if _is_int(first) else 0}"
    return "cpu"


def train_problem(cfg: DictConfig, mc: ModelConfig) -> str | None:
    """One line if a training run of ``cfg`` (its model ``mc``: before the corpus is loaded, its vocabulary as
    ``checks._model_problems`` puts it; ``train`` asks again with the corpus's) cannot fit in what this machine has
    (``fit_problem``): each process's training step and its evaluation (the val and test streams'
    memories), on the trainer's device; CPU processes (trainer.devices) share the RAM."""
    if int(os.environ.get("LOCAL_RANK") or 0) > 0:
        return None  # rank 0 judged this machine for every rank, before the others started and took their share
    data, trainer = (_mapping(cfg, key) for key in ("data", "trainer"))
    batch, segment, eval_batch = data.get("batch_size"), data.get("segment_len"), data.get("eval_batch_size")
    eval_batch = batch if eval_batch is None else eval_batch
    devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes", 1)
    if not all(_is_int(x) and x >= 1 for x in (batch, segment, eval_batch)):
        return None  # named by the data checks
    ranks = (devices if _is_int(devices) and devices >= 1 else 1) * (nodes if _is_int(nodes) and nodes >= 1 else 1)
    device = _device(trainer.get("accelerator", "cpu"), devices)
    processes = devices if device == "cpu" and _is_int(devices) and devices > 1 else 1
    per_rank = [-(-b // ranks) for b in (batch, eval_batch)]  # each rank's streams
    largest = ("data.eval_batch_size", eval_batch) if eval_batch > batch else ("data.batch_size", batch)
    options = {name: (f"model.{name}", getattr(mc, name)) for name in MODEL_SIZES if getattr(mc, name) is not None}
    options |= {"mem_len": ("model.mem_len", mc.mem_len), "segment_len": ("data.segment_len", segment)}
    return fit_problem(
        mc,
        Shape(per_rank[0], segment, mc.mem_len),
        [Shape(per_rank[1], segment, mc.mem_len)] * 2,  # the val and the test streams' memories
        device,
        {**options, "batch": largest},
        processes,
    )

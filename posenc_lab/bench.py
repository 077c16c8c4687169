"""Speed and memory of the positional schemes: ``posenc-lab bench`` / ``python -m posenc_lab.bench``.

For every scheme, with and without memory, per config and precision:

- training tokens/s: forward + backward + AdamW step, memory carried from step to step;
- evaluation tokens/s: ``no_grad`` forward with memory reuse;
- peak memory: on CUDA ``torch.cuda.max_memory_allocated`` above what was allocated before; on CPU the
  growth of the process's peak resident set (``VmHWM`` of ``/proc/self/status``, reset through
  ``/proc/self/clear_refs`` before each measurement; ``ru_maxrss`` where that is not possible). Training
  counts from before the model is built (weights, gradients, AdamW state, activations, memory);
  evaluation counts above the resident model (activations and memory only). RSS counts pages touched,
  so it includes allocator caching; it is a process-level figure, not a tensor-level one;
- model FLOPs utilisation (MFU): ``model_flops_per_token`` x tokens/s over the peak of a large matmul
  of the same dtype, measured in the same run (the best of a few repetitions).

Every figure is the median of several timed repetitions after warm-up steps. Random tokens: speed does
not depend on the text.

    python -m posenc_lab.bench --configs small --schemes xl,shaw,sinusoid --precisions fp32 --out bench/
    python -m posenc_lab.bench --eval-speed --configs small --attention-len 800

On a shared CPU machine, OpenMP worker threads that spin while another process holds the core slow small
operations by an order of magnitude; this module therefore asks libgomp for a passive wait policy
(``OMP_WAIT_POLICY=PASSIVE``) when it is imported before torch, unless the variable is set already.
"""

from __future__ import annotations

import os
import sys

_OMP_POLICY_APPLIES = "torch" not in sys.modules  # libgomp reads it once, when torch loads it
if _OMP_POLICY_APPLIES:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import csv
import datetime as _dt
import math
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable, Sequence

import torch

from .model import MemoryTransformer, ModelConfig
from .positional import SCHEME_NAMES


# --------------------------------------------------------------------------------------------------
# configurations
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchConfig:
    """A model size plus the lengths and batch it is timed at."""

    name: str
    n_layer: int
    d_model: int
    n_head: int
    d_inner: int
    segment_len: int
    mem_len: int
    batch_size: int
    vocab_size: int = 256

    def model_config(self, scheme: str, memory: bool, **overrides) -> ModelConfig:
        kw = dict(vocab_size=self.vocab_size, n_layer=self.n_layer, d_model=self.d_model, n_head=self.n_head,
                  d_inner=self.d_inner, mem_len=self.mem_len if memory else 0, posenc=scheme,
                  posenc_kwargs=scheme_kwargs(scheme, self.segment_len, self.mem_len))
        kw.update(overrides)
        return ModelConfig(**kw)


CONFIGS: dict[str, BenchConfig] = {
    "tiny": BenchConfig("tiny", n_layer=2, d_model=32, n_head=2, d_inner=64, segment_len=16, mem_len=16, batch_size=2),
    # for the bf16-mixed vs fp32 loss curves where bf16 matmuls are slow (CPUs without AMX / AVX512-BF16)
    "mini": BenchConfig("mini", n_layer=2, d_model=128, n_head=4, d_inner=512, segment_len=64, mem_len=64, batch_size=8),
    "small": BenchConfig("small", n_layer=4, d_model=128, n_head=4, d_inner=512, segment_len=128, mem_len=128,
                         batch_size=16),
    "base": BenchConfig("base", n_layer=6, d_model=512, n_head=8, d_inner=2048, segment_len=256, mem_len=256,
                        batch_size=8),
}

PRECISIONS = ("fp32", "bf16-mixed")


def scheme_kwargs(scheme: str, segment_len: int, mem_len: int) -> dict:
    """Options a scheme needs to serve these lengths (the learned table must cover the segment)."""
    if scheme == "learned":
        return {"max_positions": max(512, segment_len)}
    return {}


# --------------------------------------------------------------------------------------------------
# FLOP count
# --------------------------------------------------------------------------------------------------
def model_flops_per_token(cfg: ModelConfig, segment_len: int, mem_len: int, training: bool = True,
                          batch_size: int = 1) -> float:
    """Matmul FLOPs per predicted token of one segment of ``segment_len`` tokens with ``mem_len`` memory.

    Counts 2*m*n*k for every matrix product of the model, per segment (per stream), divided by
    ``segment_len``; a product shared by the ``batch_size`` streams (xl's position projection) is
    divided among them:

    per layer (L = segment_len, M = mem_len, N = M + L, D = d_model, F = d_inner):
      q projection            2 L D D
      k, v projections        2 N D 2D       (the memory's states are projected again every segment)
      scores q k^T            2 L N D        (every query against all N keys; the causal mask is not discounted)
      values p v              2 L N D
      output projection       2 L D D
      feed-forward            2 L D F  x 2
      xl:   W_{k,R} R_d        2 N D D / B    position projection of the N distances, once per batch
            (q + v) . r        2 L N D        terms (b) + (d)
      shaw: q a^K^T            2 L D (2K+1)   and  P a^V:  2 L (2K+1) D
    output head                2 L D V
    Embedding lookups, positional tables, layer norms, softmax and element-wise work are not counted.
    Training = 3 x forward (the backward pass costs two matmuls per forward matmul).
    """
    L, M = int(segment_len), int(mem_len)
    N, D, F, V = M + L, cfg.d_model, cfg.d_inner, cfg.vocab_size
    per_layer = (
        2 * L * D * D  # q
        + 2 * N * D * 2 * D  # k, v
        + 2 * L * N * D  # q k^T
        + 2 * L * N * D  # p v
        + 2 * L * D * D  # output projection
        + 2 * 2 * L * D * F  # feed-forward
    )
    if cfg.posenc == "xl":
        per_layer += 2 * N * D * D / batch_size + 2 * L * N * D
    elif cfg.posenc == "shaw":
        rows = 2 * int(cfg.posenc_kwargs.get("K", 16)) + 1
        per_layer += 2 * 2 * L * D * rows
    forward = cfg.n_layer * per_layer + 2 * L * D * V
    return (3 if training else 1) * forward / L


# --------------------------------------------------------------------------------------------------
# measurement helpers
# --------------------------------------------------------------------------------------------------
def pick_device(device: str | None = None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return torch.autocast(device.type, enabled=False)
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


def _read_status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _release_free_heap() -> None:
    """Return freed heap pages to the OS (glibc malloc_trim), so RSS growth shows new allocations."""
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Peak memory growth (MiB) over a block: CUDA allocator peak, or the process's peak RSS on CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_mb = float("nan")
        self.method = ""

    def __enter__(self):
        if self.device.type == "cuda":
            _sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            self.method = "cuda max_memory_allocated"
            return self
        _release_free_heap()  # so that memory freed by earlier runs is not silently reused unseen
        self._reset_ok = False
        try:  # Linux >= 4.0: writing 5 resets VmHWM to the current RSS
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._reset_ok = _read_status_kb("VmHWM") is not None
        except OSError:
            pass
        if self._reset_ok:
            self._base = _read_status_kb("VmRSS")
            self.method = "VmHWM - VmRSS at start (clear_refs)"
        else:
            import resource

            self._base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
            self.method = "ru_maxrss delta"
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            _sync(self.device)
            self.peak_mb = (torch.cuda.max_memory_allocated(self.device) - self._base) / 2**20
        elif self._reset_ok:
            self.peak_mb = max(0.0, (_read_status_kb("VmHWM") - self._base) / 1024)
        else:
            import resource

            self.peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self._base) / 1024
        return False


def _median_time(fn: Callable[[], None], device: torch.device, warmup: int, reps: int,
                 cpu_times: list | None = None) -> float:
    """Median seconds of one call of ``fn`` over ``reps`` timed calls after ``warmup`` calls.

    ``cpu_times`` (optional) receives the process CPU seconds of each timed call (all threads): on a
    shared machine, wall time includes waiting for the cores; CPU time is the work done."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(reps):
        cpu, start = time.process_time(), time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
        if cpu_times is not None:
            cpu_times.append(time.process_time() - cpu)
    return statistics.median(times)


def matmul_peak_flops(dtype: torch.dtype = torch.float32, device: str | torch.device | None = None,
                      max_n: int | None = None, reps: int = 5, min_seconds: float = 0.05,
                      cpu_time: bool = False) -> float:
    """FLOP/s of a large square matmul of ``dtype`` (best of ``reps``, of torch.mm and F.linear): the
    hardware ceiling for MFU.

    The size doubles from 256 until one product takes ``min_seconds`` or reaches ``max_n`` (2048 on CPU,
    8192 on CUDA), so a dtype without fast kernels on this CPU does not stall the run.
    ``cpu_time``: time by process CPU seconds / threads instead of wall seconds (CPU only): the rate per
    core-second actually given to the process, which other processes on a shared machine do not lower.
    """
    device = pick_device(device if device is None else str(device))
    max_n = max_n or (8192 if device.type == "cuda" else 2048)
    n = 256
    while True:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        torch.mm(a, b)
        _sync(device)
        start = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        if time.perf_counter() - start >= min_seconds or n >= max_n:
            break
        n *= 2
    best = math.inf
    clock, per = (time.process_time, torch.get_num_threads()) if cpu_time and device.type == "cpu" else (time.perf_counter, 1)
    # torch.mm and F.linear can take different kernels (on CPUs without bf16 hardware, bf16 torch.mm
    # is far slower than the oneDNN linear the model uses): the peak is the faster of the two
    for product in (lambda: torch.mm(a, b), lambda: torch.nn.functional.linear(a, b)):
        product()
        for _ in range(reps):
            start = clock()
            product()
            _sync(device)
            best = min(best, (clock() - start) / per)
    return 2 * n**3 / best


# --------------------------------------------------------------------------------------------------
# one scheme, one config
# --------------------------------------------------------------------------------------------------
@dataclass
class BenchResult:
    config: str
    scheme: str
    mem_len: int
    precision: str
    device: str
    batch: int
    segment_len: int
    params: int
    train_ms: float
    train_tok_s: float
    train_cpu_ms: float  # process CPU time per step, all threads (wall time minus waiting, x threads)
    eval_ms: float
    eval_tok_s: float
    eval_cpu_ms: float
    train_peak_mb: float
    eval_peak_mb: float
    train_gflop_per_step: float
    matmul_peak_gflops: float
    train_mfu: float
    eval_mfu: float
    # CPU only (nan on CUDA): model FLOPs per (process CPU second / threads) over the matmul peak timed the same
    # way; what the step achieves on the core time it is given, unaffected by other processes on the cores
    matmul_peak_cpu_gflops: float = float("nan")
    train_mfu_cpu: float = float("nan")
    eval_mfu_cpu: float = float("nan")
    extra: dict = field(default_factory=dict, repr=False)

    def row(self) -> dict:
        d = asdict(self)
        d.pop("extra")
        return d


COLUMNS = [f.name for f in fields(BenchResult) if f.name != "extra"]


def _tokens(cfg: ModelConfig, batch: int, length: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(cfg.vocab_size, (batch, length + 1), generator=generator).to(device)


def make_optimizer(model: torch.nn.Module, lr: float = 1e-3) -> torch.optim.Optimizer:
    """AdamW, the fused kernel where this torch has it for the device (one kernel for all tensors)."""
    try:
        return torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)


def bench_one(bench_cfg: BenchConfig | str, scheme: str, memory: bool = True, precision: str = "fp32",
              device: str | torch.device | None = None, warmup: int = 3, reps: int = 5,
              matmul_peak: float | None = None, compile: bool = False, seed: int = 0,
              model_overrides: dict | None = None, matmul_peak_cpu: float | None = None) -> BenchResult:
    """Train and eval throughput, peak memory and MFU of one scheme in one config (see the module doc)."""
    bc = CONFIGS[bench_cfg] if isinstance(bench_cfg, str) else bench_cfg
    device = pick_device(None if device is None else str(device))
    cfg = bc.model_config(scheme, memory, **(model_overrides or {}))
    B, L, M = bc.batch_size, bc.segment_len, cfg.mem_len
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    if matmul_peak is None:
        matmul_peak = matmul_peak_flops(dtype, device)
    if matmul_peak_cpu is None and device.type == "cpu":
        matmul_peak_cpu = matmul_peak_flops(dtype, device, cpu_time=True)

    # -- training -------------------------------------------------------------------------------
    data = _tokens(cfg, B, L, device, gen)
    with PeakMemory(device) as train_mem:
        model = MemoryTransformer(cfg).to(device)
        model.validate_lengths(L, M)
        model.train()
        step_model = torch.compile(model) if compile else model
        opt = make_optimizer(model)
        state = {"mems": None}

        def train_step():
            with _autocast(device, precision):
                out = step_model(data[:, :-1], data[:, 1:], mems=state["mems"])
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            opt.step()
            state["mems"] = out.mems if M > 0 else None

        train_cpu: list[float] = []
        train_s = _median_time(train_step, device, warmup, reps, train_cpu)
    params = model.num_params()

    # -- evaluation -----------------------------------------------------------------------------
    model.eval()
    state["mems"] = None
    del opt
    with PeakMemory(device) as eval_mem:

        def eval_step():
            with torch.no_grad(), _autocast(device, precision):
                out = step_model(data[:, :-1], data[:, 1:], mems=state["mems"])
            state["mems"] = out.mems if M > 0 else None

        eval_cpu: list[float] = []
        eval_s = _median_time(eval_step, device, warmup, reps, eval_cpu)

    train_flops = model_flops_per_token(cfg, L, M, training=True, batch_size=B)
    eval_flops = model_flops_per_token(cfg, L, M, training=False, batch_size=B)
    tokens = B * L
    result = BenchResult(
        config=bc.name, scheme=scheme, mem_len=M, precision=precision, device=_device_name(device), batch=B,
        segment_len=L, params=params,
        train_ms=train_s * 1e3, train_tok_s=tokens / train_s, train_cpu_ms=statistics.median(train_cpu) * 1e3,
        eval_ms=eval_s * 1e3, eval_tok_s=tokens / eval_s, eval_cpu_ms=statistics.median(eval_cpu) * 1e3,
        train_peak_mb=train_mem.peak_mb, eval_peak_mb=eval_mem.peak_mb,
        train_gflop_per_step=train_flops * tokens / 1e9, matmul_peak_gflops=matmul_peak / 1e9,
        train_mfu=train_flops * tokens / train_s / matmul_peak, eval_mfu=eval_flops * tokens / eval_s / matmul_peak,
        extra={"memory_method": train_mem.method, "compile": compile},
    )
    if device.type == "cpu":
        threads = torch.get_num_threads()
        result.matmul_peak_cpu_gflops = matmul_peak_cpu / 1e9
        result.train_mfu_cpu = train_flops * tokens / (result.train_cpu_ms / 1e3 / threads) / matmul_peak_cpu
        result.eval_mfu_cpu = eval_flops * tokens / (result.eval_cpu_ms / 1e3 / threads) / matmul_peak_cpu
    return result


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu x{torch.get_num_threads()}"


def run_benchmark(configs: Sequence[str] = ("small",), schemes: Sequence[str] = SCHEME_NAMES,
                  precisions: Sequence[str] = ("fp32",), memory: Sequence[bool] = (True, False),
                  device: str | None = None, warmup: int = 3, reps: int = 5, compile: bool = False,
                  log: Callable[[str], None] | None = print, matmul_max_n: int | None = None) -> list[BenchResult]:
    """``bench_one`` over the grid; the matmul peak is measured once per precision in this run."""
    dev = pick_device(device)
    dtypes = {p: torch.float32 if p == "fp32" else torch.bfloat16 for p in precisions}
    peaks = {p: matmul_peak_flops(dtypes[p], dev, matmul_max_n) for p in precisions}
    peaks_cpu = {p: matmul_peak_flops(dtypes[p], dev, matmul_max_n, cpu_time=True) if dev.type == "cpu" else None
                 for p in precisions}
    results = []
    for c in configs:
        for p in precisions:
            for s in schemes:
                for mem in memory:
                    r = bench_one(c, s, memory=mem, precision=p, device=dev, warmup=warmup, reps=reps,
                                  matmul_peak=peaks[p], compile=compile, matmul_peak_cpu=peaks_cpu[p])
                    results.append(r)
                    if log:
                        log(_format_row(r.row()))
    return results


# --------------------------------------------------------------------------------------------------
# evaluation speed: memory reuse against a sliding window
# --------------------------------------------------------------------------------------------------
def measure_eval_speed(model_cfg: ModelConfig | str = "small", attention_len: int = 800, segment_len: int = 128,
                       batch_size: int = 4, scheme: str | None = None, precision: str = "fp32",
                       device: str | torch.device | None = None, warmup: int = 1, reps: int = 3,
                       model: MemoryTransformer | None = None) -> dict:
    """Per-token evaluation time with memory reuse vs recomputing a sliding window, at ``attention_len``.

    Memory reuse: segments of ``segment_len`` tokens, memory ``M' = attention_len`` and the same-length
    mask, so every token sees exactly ``attention_len`` previous tokens; one forward predicts
    ``batch_size * segment_len`` tokens. Sliding window (the vanilla evaluation): every predicted token
    gets a fresh window of its ``attention_len`` previous tokens, one forward of ``attention_len + 1``
    tokens per predicted token (``batch_size`` windows per forward). Same model, same weights.

    ``model_cfg``: a ModelConfig, or the name of a bench config (``scheme`` picks the scheme, xl by default).
    Returns a dict: attention_len, segment_len, batch, memory_tok_s, window_tok_s, speedup (memory/window,
    wall time), speedup_cpu (the same from process CPU time), and the milliseconds per forward.
    """
    device = pick_device(None if device is None else str(device))
    if isinstance(model_cfg, str):
        scheme = scheme or "xl"  # a learned table must cover the sliding window of attention_len + 1
        model_cfg = CONFIGS[model_cfg].model_config(scheme, memory=False, dropout=0.0,
                                                    posenc_kwargs=scheme_kwargs(scheme, attention_len + 1, 0))
    elif scheme is not None:
        model_cfg = ModelConfig(**{**asdict(model_cfg), "posenc": scheme})
    if model is None:
        torch.manual_seed(0)
        model = MemoryTransformer(model_cfg).to(device)
    cfg = model.cfg
    saved = model.mem_len, model.same_length, model.training
    model.eval()
    gen = torch.Generator().manual_seed(0)
    A, L, B = int(attention_len), int(segment_len), int(batch_size)
    try:
        with torch.no_grad(), _autocast(device, precision):
            # memory reuse
            model.mem_len, model.same_length = A, True
            model.validate_lengths(L, A)
            seg = _tokens(cfg, B, L, device, gen)
            state = {"mems": None}
            for _ in range(-(-A // L)):  # fill the memory to its full length first
                state["mems"] = model(seg[:, :-1], mems=state["mems"]).mems

            def memory_step():
                state["mems"] = model(seg[:, :-1], seg[:, 1:], mems=state["mems"]).mems

            memory_cpu: list[float] = []
            memory_s = _median_time(memory_step, device, warmup, reps, memory_cpu)
            # sliding window
            model.mem_len, model.same_length = 0, False
            model.validate_lengths(A + 1, 0)
            win = _tokens(cfg, B, A + 1, device, gen)

            def window_step():
                model(win[:, :-1], win[:, 1:])

            window_cpu: list[float] = []
            window_s = _median_time(window_step, device, warmup, reps, window_cpu)
    finally:
        model.mem_len, model.same_length = saved[0], saved[1]
        model.train(saved[2])
    memory_tok_s = B * L / memory_s
    window_tok_s = B / window_s
    return {"scheme": cfg.posenc, "attention_len": A, "segment_len": L, "batch": B, "precision": precision,
            "device": _device_name(device), "memory_ms_per_segment": memory_s * 1e3,
            "window_ms_per_window": window_s * 1e3, "memory_tok_s": memory_tok_s, "window_tok_s": window_tok_s,
            "speedup": memory_tok_s / window_tok_s,
            # the same ratio from process CPU time per token (robust to other processes on the cores)
            "speedup_cpu": (statistics.median(window_cpu) / B) / (statistics.median(memory_cpu) / (B * L))}


# --------------------------------------------------------------------------------------------------
# bf16-mixed against fp32: training loss curves on real text
# --------------------------------------------------------------------------------------------------
def loss_curves(bench_cfg: BenchConfig | str = "tiny", scheme: str = "xl", steps: int = 300,
                runs: Sequence[tuple[str, int]] = (("fp32", 0), ("bf16-mixed", 0), ("fp32", 1)),
                lr: float = 1e-3, corpus: str = "pystdlib", max_bytes: int = 2_000_000,
                device: str | torch.device | None = None, log: Callable[[str], None] | None = None) -> dict:
    """Training loss per step for each (precision, seed) run: same data order, memory carried, AdamW.

    Weights are initialised from ``seed``; the batches (``corpus`` train split, byte level, ordered
    streams) are the same for every run. A second fp32 seed measures the run-to-run noise the
    bf16-mixed difference is compared with. Returns {"runs": {"fp32/seed0": [losses], ...}, "steps": n}.
    """
    from .data import load_corpus

    bc = CONFIGS[bench_cfg] if isinstance(bench_cfg, str) else bench_cfg
    device = pick_device(None if device is None else str(device))
    data = load_corpus(corpus, max_bytes=max_bytes)
    curves = {}
    for precision, seed in runs:
        torch.manual_seed(seed)
        cfg = bc.model_config(scheme, memory=bc.mem_len > 0)
        model = MemoryTransformer(cfg).to(device).train()
        opt = make_optimizer(model, lr)
        stream = iter(data.stream("train", bc.segment_len, bc.batch_size))
        mems, losses = None, []
        for step in range(steps):
            try:
                batch = next(stream)
            except StopIteration:
                stream, mems = iter(data.stream("train", bc.segment_len, bc.batch_size)), None
                batch = next(stream)
            if bool(batch["reset"]):
                mems = None
            with _autocast(device, precision):
                out = model(batch["tokens"].to(device), batch["targets"].to(device), mems=mems,
                            offset=batch["offset"].to(device))
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            opt.step()
            mems = out.mems or None
            losses.append(float(out.loss.detach()))
            if log and (step + 1) % 50 == 0:
                log(f"{precision} seed {seed}: step {step + 1} loss {statistics.fmean(losses[-50:]):.4f}")
        curves[f"{precision}/seed{seed}"] = losses
    return {"runs": curves, "steps": steps, "config": bc.name, "scheme": scheme}


def summarize_curves(curves: dict, window: int = 50) -> list[dict]:
    """Mean loss over the last ``window`` steps per run, and each run's gap to the first run."""
    runs = curves["runs"]
    names = list(runs)
    ref = runs[names[0]]
    rows = []
    for name in names:
        c = runs[name]
        diffs = [a - b for a, b in zip(c, ref)]
        rows.append({"run": name, "final_loss": statistics.fmean(c[-window:]),
                     "gap_to_first": statistics.fmean(c[-window:]) - statistics.fmean(ref[-window:]),
                     "mean_abs_step_diff": statistics.fmean(abs(d) for d in diffs)})
    return rows


# --------------------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------------------
def _fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.3f}"
    return str(v)


def _format_row(row: dict, columns: Sequence[str] | None = None) -> str:
    columns = columns or list(row)
    return "  ".join(f"{c}={_fmt(row[c])}" for c in columns)


def format_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """A plain-text table, right-aligned numbers."""
    if not rows:
        return "(no results)"
    columns = list(columns or rows[0].keys())
    cells = [[_fmt(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def markdown_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return ""
    columns = list(columns or rows[0].keys())
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(_fmt(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_outputs(rows: Sequence[dict], out: Path, stem: str, header: str = "") -> dict[str, Path]:
    """``stem``.csv and ``stem``.md under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / f"{stem}.csv", out / f"{stem}.md"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    md_path.write_text((header + "\n\n" if header else "") + markdown_table(rows) + "\n")
    return {"csv": csv_path, "md": md_path}


def environment_line() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (f"{_dt.datetime.now().isoformat(timespec='seconds')}  torch {torch.__version__}  "
            f"{platform.processor() or platform.machine()}  threads {torch.get_num_threads()}  "
            f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}"
            f"{'' if _OMP_POLICY_APPLIES else ' (torch was loaded before bench: may not apply)'}  "
            f"load avg {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------
def _csv_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="posenc-lab bench", description="Speed, memory and MFU of the positional schemes.")
    p.add_argument("--configs", default="small", help=f"comma-separated, from {','.join(CONFIGS)} (default: small)")
    p.add_argument("--schemes", default="all", help="comma-separated scheme names, or 'all' (default)")
    p.add_argument("--precisions", default="fp32", help=f"comma-separated, from {','.join(PRECISIONS)}")
    p.add_argument("--memory", default="both", choices=["both", "on", "off"], help="with memory, without, or both")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU; default: torch's)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before timing")
    p.add_argument("--reps", type=int, default=5, help="timed steps; the median is quoted")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--matmul-max-n", type=int, default=None,
                   help="largest square matmul for the peak (default 2048 on CPU, 8192 on CUDA)")
    p.add_argument("--out", type=Path, default=None, help="write bench.csv and bench.md (and eval_speed.*) here")
    p.add_argument("--eval-speed", action="store_true",
                   help="instead: evaluation with memory reuse vs a sliding window at --attention-len")
    p.add_argument("--attention-len", default="800", help="comma-separated attention lengths for --eval-speed")
    p.add_argument("--eval-segment-len", type=int, default=128, help="segment length of memory-reuse evaluation")
    p.add_argument("--eval-batch", type=int, default=4, help="streams (windows) per forward in --eval-speed")
    p.add_argument("--loss-curve", type=int, default=0, metavar="STEPS",
                   help="instead: train STEPS steps on pystdlib in fp32 (seeds 0, 1) and bf16-mixed (seed 0), "
                        "compare the loss curves (first config and scheme)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    configs = _csv_list(args.configs)
    unknown = [c for c in configs if c not in CONFIGS]
    schemes = list(SCHEME_NAMES) if args.schemes == "all" else _csv_list(args.schemes)
    unknown += [s for s in schemes if s not in SCHEME_NAMES]
    precisions = _csv_list(args.precisions)
    unknown += [p for p in precisions if p not in PRECISIONS]
    if unknown:
        print(f"posenc-lab bench: unknown {unknown}; configs: {list(CONFIGS)}, schemes: {list(SCHEME_NAMES)}, "
              f"precisions: {list(PRECISIONS)}", file=sys.stderr)
        return 2
    env = environment_line()
    command = "posenc-lab bench " + " ".join(sys.argv[1:] if argv is None else argv)
    print(env)
    if args.loss_curve:
        scheme = schemes[0] if args.schemes != "all" else "xl"
        curves = loss_curves(configs[0], scheme, args.loss_curve, device=args.device,
                             log=lambda line: print(line, flush=True))
        rows = summarize_curves(curves)
        print(format_table(rows))
        if args.out:
            write_outputs(rows, args.out, "loss_curve", f"{env}\n\n`{command}`")
            per_step = [{"step": i + 1, **{k: v[i] for k, v in curves["runs"].items()}} for i in range(curves["steps"])]
            with open(args.out / "loss_curve_steps.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(per_step[0]))
                w.writeheader()
                w.writerows(per_step)
        return 0
    if args.eval_speed:
        rows = []
        for c in configs:
            for s in schemes if args.schemes != "all" else ["xl"]:
                for p in precisions:
                    for A in (int(a) for a in _csv_list(args.attention_len)):
                        r = measure_eval_speed(c, A, args.eval_segment_len, args.eval_batch, scheme=s, precision=p,
                                               device=args.device)
                        r["config"] = c
                        rows.append(r)
                        print(_format_row(r))
        print(format_table(rows))
        if args.out:
            write_outputs(rows, args.out, "eval_speed", f"{env}\n\n`{command}`")
        return 0
    memory = {"both": (True, False), "on": (True,), "off": (False,)}[args.memory]
    results = run_benchmark(configs, schemes, precisions, memory, args.device, args.warmup, args.reps,
                            args.compile, log=lambda line: print(line, flush=True), matmul_max_n=args.matmul_max_n)
    rows = [r.row() for r in results]
    print()
    print(format_table(rows))
    if results:
        print(f"peak memory: {results[0].extra['memory_method']}")
    if args.out:
        paths = write_outputs(rows, args.out, "bench", f"{env}\n\n`{command}`")
        print(f"wrote {paths['csv']} and {paths['md']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

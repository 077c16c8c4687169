"""The timed loops: training and evaluation steps of one grid point, and evaluation with memory reuse
against a sliding window.

Every figure is the median of several timed repetitions after warm-up steps. Random tokens: speed does
not depend on the text. Memory goes from step to step through ``model.Recurrence``, as in training.
Training counts peak memory from before the model is built (weights, gradients, AdamW state, activations,
memory); evaluation counts above the resident model (activations and memory).
MFU is ``model_flops_per_token`` x tokens/s over the peak of a large matmul of the same dtype, measured
in the same run.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields

import torch

from ..model import MemoryTransformer, ModelConfig, Recurrence
from ..positional import fused, scheme_names
from ..tables import text_row
from .configs import BenchConfig
from .flops import model_flops_per_token
from .probes import PeakMemory, autocast, device_name, matmul_peak_flops, median_time, pick_device
from .schemes import SchemeSpec, as_spec


@dataclass(frozen=True)
class Point:
    """One cell of the benchmark grid. A new dimension (say, fused kernels on/off) is a field here and a
    keyword of ``bench_one`` (and a CLI option); it becomes a grid axis and a table column by itself."""

    config: str
    scheme: str
    precision: str = "fp32"
    memory: bool = True
    compile: bool = False
    attention: str = "auto"  # model.attention_impl: auto | fused | unfused (positional/fused.py)


def grid(**axes: Sequence) -> list[Point]:
    """Every combination of the axes (``Point`` fields -> values), the first axis outermost."""
    valid = [f.name for f in fields(Point)]
    unknown = sorted(set(axes) - set(valid))
    if unknown:
        raise ValueError(f"unknown benchmark axis {unknown}; valid: {valid}")
    return [Point(**dict(zip(axes, values))) for values in itertools.product(*axes.values())]


@dataclass
class BenchResult:
    """What ``bench_one`` measured at one point (the point's fields lead each table row)."""

    point: Point
    mem_len: int
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
    # the first training / evaluation step, which compiles under compile=True (its cost in a run: add_compile_cost)
    train_first_ms: float = float("nan")
    eval_first_ms: float = float("nan")
    extra: dict = field(default_factory=dict, repr=False)

    def __getattr__(self, name: str):  # r.scheme, r.precision, ...: the point's fields
        if name != "point" and name in {f.name for f in fields(Point)}:
            return getattr(self.point, name)
        raise AttributeError(name)

    def row(self) -> dict:
        point = {k: v for k, v in asdict(self.point).items() if k != "memory"}  # mem_len says it
        measured = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("point", "extra")}
        return {**point, **measured}


COLUMNS = [f.name for f in fields(Point) if f.name != "memory"] + [
    f.name for f in fields(BenchResult) if f.name not in ("point", "extra")
]
#: what identifies a grid point in a table row: the Point's fields, with mem_len standing for memory
POINT_KEYS = tuple("mem_len" if f.name == "memory" else f.name for f in fields(Point))


def _tokens(cfg: ModelConfig, batch: int, length: int, device: torch.device, generator: torch.Generator):
    return torch.randint(cfg.vocab_size, (batch, length + 1), generator=generator).to(device)


def make_optimizer(model: torch.nn.Module, lr: float = 1e-3) -> torch.optim.Optimizer:
    """AdamW, the fused kernel where this torch has it for the device (one kernel for all tensors)."""
    try:
        return torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)


def _dtype(precision: str) -> torch.dtype:
    return torch.float32 if precision == "fp32" else torch.bfloat16


def _unless_cannot_run(timed: Callable[[], float], cpu_times: list, not_run: list, compiled: bool = False) -> float:
    """``timed()``, or NaN where the forced fused attention cannot run here or, for a compiled point, where
    torch.compile failed: the reason goes to ``not_run``, and the grid goes on."""
    try:
        return timed()
    except RuntimeError as e:
        if "attention_impl=fused cannot run here" in str(e):
            not_run.append(str(e))
        elif compiled:
            not_run.append(f"torch.compile failed: {type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}")
        else:
            raise
        cpu_times.append(float("nan"))
        return float("nan")


def bench_one(
    bench_cfg: BenchConfig | str,
    scheme: str,
    memory: bool = True,
    precision: str = "fp32",
    device: str | torch.device | None = None,
    warmup: int = 3,
    reps: int = 5,
    matmul_peak: float | None = None,
    compile: bool = False,
    seed: int = 0,
    model_overrides: dict | None = None,
    matmul_peak_cpu: float | None = None,
    attention: str = "auto",
    options: dict | None = None,
    label: str | None = None,
    compile_mode: str = "default",
) -> BenchResult:
    """Train and eval throughput, peak memory and MFU of one scheme in one config (see the module doc).
    ``attention``: model.attention_impl; where the fused path cannot run (CPU training), that loop's
    figures are NaN and ``extra["not_run"]`` says why. ``options``: the scheme's, over its yaml's; ``label``: the
    point's name for the scheme (``schemes.SchemeSpec.label``; default the scheme); ``compile_mode``: torch.compile's
    ``mode`` where ``compile`` (reduce-overhead: each step starts a new CUDA-graph generation, as a training loop)."""
    bc = BenchConfig.preset(bench_cfg) if isinstance(bench_cfg, str) else bench_cfg
    point = Point(bc.name, label or scheme, precision, memory, compile, attention)
    device = pick_device(None if device is None else str(device))
    overrides = {"attention_impl": attention, **(model_overrides or {})}
    cfg = bc.model_config(scheme, memory, options=options, **overrides)
    B, L, M = bc.batch_size, bc.segment_len, cfg.mem_len
    if compile or attention != "unfused":
        fused.reset()  # each point compiles its own kernels, none left from the point before
    if M > 0 and (compile or attention != "unfused"):
        warmup = max(warmup, 2)  # the first step compiles (the memory is static: later steps do not)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if matmul_peak is None:
        matmul_peak = matmul_peak_flops(_dtype(precision), device)
    if matmul_peak_cpu is None and device.type == "cpu":
        matmul_peak_cpu = matmul_peak_flops(_dtype(precision), device, cpu_time=True)

    # -- training -------------------------------------------------------------------------------
    data = _tokens(cfg, B, L, device, gen)
    not_run: list[str] = []
    with PeakMemory(device) as train_mem:
        model = MemoryTransformer(cfg).to(device)
        model.validate_lengths(L, M)
        model.train()
        step_model = (
            torch.compile(model, mode=None if compile_mode == "default" else compile_mode) if compile else model
        )
        # reduce-overhead: the outputs of the step before (its memory) may be overwritten from here on
        begin = torch.compiler.cudagraph_mark_step_begin if compile else (lambda: None)
        opt = make_optimizer(model)
        memory = Recurrence()

        def train_step():
            model.at_step(0)  # as the training step: projected parameters clamped outside the compiled graph
            begin()
            with autocast(device, precision):
                out = memory.step(step_model, data[:, :-1], data[:, 1:])
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            opt.step()

        train_cpu: list[float] = []
        train_first: list[float] = []
        train_s = _unless_cannot_run(
            lambda: median_time(train_step, device, warmup, reps, train_cpu, train_first), train_cpu, not_run, compile
        )
    params = model.num_params()

    # -- evaluation -----------------------------------------------------------------------------
    model.eval()
    memory.clear()
    with PeakMemory(device) as eval_mem:

        def eval_step():
            begin()
            with torch.no_grad(), autocast(device, precision):
                memory.step(step_model, data[:, :-1], data[:, 1:])

        eval_cpu: list[float] = []
        eval_first: list[float] = []
        eval_s = _unless_cannot_run(
            lambda: median_time(eval_step, device, warmup, reps, eval_cpu, eval_first), eval_cpu, not_run, compile
        )

    train_flops = model_flops_per_token(model, L, M, training=True, batch_size=B)
    eval_flops = model_flops_per_token(model, L, M, training=False, batch_size=B)
    tokens = B * L
    result = BenchResult(
        point=point,
        mem_len=M,
        device=device_name(device),
        batch=B,
        segment_len=L,
        params=params,
        train_ms=train_s * 1e3,
        train_tok_s=tokens / train_s,
        train_cpu_ms=statistics.median(train_cpu) * 1e3,
        eval_ms=eval_s * 1e3,
        eval_tok_s=tokens / eval_s,
        eval_cpu_ms=statistics.median(eval_cpu) * 1e3,
        train_peak_mb=train_mem.peak_mb,
        eval_peak_mb=eval_mem.peak_mb,
        train_gflop_per_step=train_flops * tokens / 1e9,
        matmul_peak_gflops=matmul_peak / 1e9,
        train_mfu=train_flops * tokens / train_s / matmul_peak,
        eval_mfu=eval_flops * tokens / eval_s / matmul_peak,
        extra={"memory_method": train_mem.method, **({"not_run": not_run[0]} if not_run else {})},
        train_first_ms=train_first[0] * 1e3 if train_first else float("nan"),
        eval_first_ms=eval_first[0] * 1e3 if eval_first else float("nan"),
    )
    if device.type == "cpu":
        threads = torch.get_num_threads()
        result.matmul_peak_cpu_gflops = matmul_peak_cpu / 1e9
        result.train_mfu_cpu = train_flops * tokens / (result.train_cpu_ms / 1e3 / threads) / matmul_peak_cpu
        result.eval_mfu_cpu = eval_flops * tokens / (result.eval_cpu_ms / 1e3 / threads) / matmul_peak_cpu
    return result


def run_benchmark(
    configs: Mapping[str, BenchConfig] | Sequence[str] = ("small",),
    schemes: Sequence[str | SchemeSpec] | None = None,
    precisions: Sequence[str] = ("fp32",),
    memory: Sequence[bool] = (True, False),
    device: str | None = None,
    warmup: int = 3,
    reps: int = 5,
    compile: Sequence[bool] | bool = (False,),
    log: Callable[[str], None] | None = print,
    matmul_max_n: int | None = None,
    attention: Sequence[str] = ("auto",),
    compile_mode: str = "default",
) -> list[BenchResult]:
    """``bench_one`` over the grid (configs x precisions x schemes x memory x compile x attention; schemes: all
    registered by default, each a name or a ``SchemeSpec`` with options, its point named by its label); the matmul
    peak is measured once per precision in this run."""
    if not isinstance(configs, Mapping):
        configs = {name: BenchConfig.preset(name) for name in configs}
    specs = {s.label: s for s in map(as_spec, scheme_names() if schemes is None else schemes)}
    compile = (compile,) if isinstance(compile, bool) else tuple(compile)
    dev = pick_device(device)
    peaks = {p: matmul_peak_flops(_dtype(p), dev, matmul_max_n) for p in precisions}
    peaks_cpu = {
        p: matmul_peak_flops(_dtype(p), dev, matmul_max_n, cpu_time=True) if dev.type == "cpu" else None
        for p in precisions
    }
    results = []
    for pt in grid(
        config=list(configs),
        precision=list(precisions),
        scheme=list(specs),
        memory=list(memory),
        compile=list(compile),
        attention=list(attention),
    ):
        spec = specs[pt.scheme]
        r = bench_one(
            configs[pt.config],
            spec.scheme,
            memory=pt.memory,
            precision=pt.precision,
            device=dev,
            warmup=warmup,
            reps=reps,
            matmul_peak=peaks[pt.precision],
            compile=pt.compile,
            matmul_peak_cpu=peaks_cpu[pt.precision],
            attention=pt.attention,
            model_overrides=spec.model,
            options=spec.options,
            label=pt.scheme,
            compile_mode=compile_mode,
        )
        results.append(r)
        if log:
            log(text_row(r.row()))
    return results


def measure_eval_speed(
    model_cfg: ModelConfig | str = "small",
    attention_len: int = 800,
    segment_len: int = 128,
    batch_size: int = 4,
    scheme: str | None = None,
    precision: str = "fp32",
    device: str | torch.device | None = None,
    warmup: int = 1,
    reps: int = 3,
    model: MemoryTransformer | None = None,
) -> dict:
    """Per-token evaluation time with memory reuse vs recomputing a sliding window, at ``attention_len``.

    Memory reuse: segments of ``segment_len`` tokens, memory ``M' = attention_len`` and the same-length
    mask, so every token sees exactly ``attention_len`` previous tokens; one forward predicts
    ``batch_size * segment_len`` tokens. Sliding window (the vanilla evaluation): every predicted token
    gets a fresh window of its ``attention_len`` previous tokens, one forward of ``attention_len + 1``
    tokens per predicted token (``batch_size`` windows per forward). Same model, same weights.

    ``model_cfg``: a ModelConfig, a BenchConfig or the name of a model preset (``scheme`` picks the scheme,
    ModelConfig's default if not given).
    Returns a dict: attention_len, segment_len, batch, memory_tok_s, window_tok_s, speedup (memory/window,
    wall time), speedup_cpu (the same from process CPU time), and the milliseconds per forward.
    """
    device = pick_device(None if device is None else str(device))
    if isinstance(model_cfg, (str, BenchConfig)):
        bc = BenchConfig.preset(model_cfg) if isinstance(model_cfg, str) else model_cfg
        # a learned table must cover the sliding window of attention_len + 1
        model_cfg = bc.model_config(
            scheme or ModelConfig.posenc, memory=False, segment_len=attention_len + 1, dropout=0.0
        )
    elif scheme is not None:
        model_cfg = ModelConfig(**{**asdict(model_cfg), "posenc": scheme})
    if model is None:
        torch.manual_seed(0)
        model = MemoryTransformer(model_cfg).to(device)
    cfg = model.cfg
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(0)
    A, L, B = int(attention_len), int(segment_len), int(batch_size)
    reuse = {"mem_len": A, "same_length": True}  # every token sees exactly A previous tokens
    try:
        with torch.no_grad(), autocast(device, precision):
            # memory reuse
            model.validate_lengths(L, A)
            seg = _tokens(cfg, B, L, device, gen)
            memory = Recurrence()
            for _ in range(-(-A // L)):  # fill the memory to its full length first
                memory.step(model, seg[:, :-1], **reuse)

            def memory_step():
                memory.step(model, seg[:, :-1], seg[:, 1:], **reuse)

            memory_cpu: list[float] = []
            memory_s = median_time(memory_step, device, warmup, reps, memory_cpu)
            # sliding window
            model.validate_lengths(A + 1, 0)
            win = _tokens(cfg, B, A + 1, device, gen)

            def window_step():
                model(win[:, :-1], win[:, 1:], mem_len=0, same_length=False)

            window_cpu: list[float] = []
            window_s = median_time(window_step, device, warmup, reps, window_cpu)
    finally:
        model.train(was_training)
    memory_tok_s = B * L / memory_s
    window_tok_s = B / window_s
    return {
        "scheme": cfg.posenc,
        "attention_len": A,
        "segment_len": L,
        "batch": B,
        "precision": precision,
        "device": device_name(device),
        "memory_ms_per_segment": memory_s * 1e3,
        "window_ms_per_window": window_s * 1e3,
        "memory_tok_s": memory_tok_s,
        "window_tok_s": window_tok_s,
        "speedup": memory_tok_s / window_tok_s,
        # the same ratio from process CPU time per token (robust to other processes on the cores)
        "speedup_cpu": (statistics.median(window_cpu) / B) / (statistics.median(memory_cpu) / (B * L)),
    }

"""``posenc-lab bench`` / ``python -m posenc_lab.bench``: the command line of the benchmark.

python -m posenc_lab.bench --configs small --schemes xl,shaw,sinusoid --precisions fp32 --out bench/
python -m posenc_lab.bench --configs tiny --schemes 'sinusoid,rope[scaling=dynamic],sinusoid[softmax_scale=ssmax]'
python -m posenc_lab.bench --eval-speed --configs small --attention-len 800
python -m posenc_lab.bench overhead --configs tiny,small --rounds 3     # the step outside the model (overhead.py)
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
from pathlib import Path

import torch
import yaml

from ..footprint import MODEL_SIZES, Shape, fit_problem
from ..io import path_problem
from ..model import ModelConfig
from ..positional import build_scheme, scheme_names
from ..positional.fused import IMPLS
from ..tables import text_row, text_table, write_table
from .configs import PRECISIONS, BenchConfig, model_presets
from .loops import POINT_KEYS, measure_eval_speed, run_benchmark
from .probes import environment_line, pick_device
from .schemes import SchemeSpec, parse_schemes


def _csv_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_assignments(text: str) -> dict:
    """``n_layer=2,mem_len=64`` -> {"n_layer": 2, "mem_len": 64} (values read as YAML)."""
    out = {}
    for item in _csv_list(text):
        key, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected key=value, got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


RATIO_OF = ("train_ms", "train_cpu_ms", "eval_ms", "eval_cpu_ms")


def add_ratios(rows: list[dict], baseline: str) -> list[dict]:
    """Each row with ``<figure>_ratio`` = its step time over ``baseline``'s at the same grid point but for
    the scheme (config, precision, mem_len, compile, attention; baseline rows: 1.0), after the figure."""
    same = tuple(k for k in POINT_KEYS if k != "scheme")
    base = {tuple(r[k] for k in same): r for r in rows if r["scheme"] == baseline}
    out = []
    for r in rows:
        ref = base.get(tuple(r[k] for k in same))
        row = {}
        for k, v in r.items():
            row[k] = v
            if k in RATIO_OF:
                row[k.replace("_ms", "_ratio")] = v / ref[k] if ref is not None and ref[k] else float("nan")
        out.append(row)
    return out


COMPILE_MODES = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]  # torch.compile's
RUN_STEPS = 1000  # the run length over which compiling is judged (a first run pays the compile once)


def add_compile_cost(rows: list[dict], steps: int = RUN_STEPS) -> list[dict]:
    """Each row with ``compile_s`` and ``eval_compile_s``, its first training and evaluation step's wall time over
    a median one's (the compile, under compile=True), and ``train_1000_ratio``: the time of a ``steps``-step
    training run with its evaluation, compiled over eager at the same point but for compile, each counting its
    first steps once: ``train_first + (steps - 1) x train + (eval_first - eval)`` (a run's evaluation compiles
    its own graph once, whatever its length; eager rows 1.0; below 1, compiling pays within such a run)."""
    same = tuple(k for k in POINT_KEYS if k != "compile")
    eager = {tuple(r[k] for k in same): r for r in rows if not r["compile"]}

    def eval_extra_ms(r: dict) -> float:
        return r.get("eval_first_ms", 0.0) - r.get("eval_ms", 0.0)

    def run_s(r: dict) -> float:
        return (r["train_first_ms"] + (steps - 1) * r["train_ms"] + eval_extra_ms(r)) / 1e3

    out = []
    for r in rows:
        ref = eager.get(tuple(r[k] for k in same))
        cost = {"compile_s": (r["train_first_ms"] - r["train_ms"]) / 1e3, "eval_compile_s": eval_extra_ms(r) / 1e3}
        cost["train_1000_ratio"] = run_s(r) / run_s(ref) if ref is not None and run_s(ref) else float("nan")
        out.append({**r, **cost})
    return out


def combine_rounds(rounds: list[list[dict]]) -> list[dict]:
    """One row per point from the rows of several rounds of the same grid (in any order): every number
    the median over the rounds, and after each ratio column ``<ratio>_min`` and ``<ratio>_max`` over the
    rounds. A ratio is each round's own (paired with the baseline of the same round), so the median
    ratio is not the ratio of the median times. NaN (a loop that could not run) is left out; a figure
    that is NaN in every round stays NaN."""
    by_point: dict[tuple, list[dict]] = {}
    for rows in rounds:
        for r in rows:
            by_point.setdefault(tuple(r[k] for k in POINT_KEYS), []).append(r)
    out = []
    for rows in by_point.values():
        row = {"rounds": len(rows)}
        for k, v in rows[0].items():
            values = [r[k] for r in rows]
            if k in POINT_KEYS or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in values):
                row[k] = v  # the point itself, or text (device, ...)
                continue
            seen = [x for x in values if not math.isnan(x)]
            # counts the rounds agree on (batch, params) stay integers
            row[k] = (seen[0] if len(set(seen)) == 1 else statistics.median(seen)) if seen else float("nan")
            if k.endswith("_ratio"):
                row[k + "_min"], row[k + "_max"] = (min(seen), max(seen)) if seen else (float("nan"),) * 2
        out.append(row)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="posenc-lab bench",
        description="Speed, memory and MFU of the positional schemes.",
        epilog="posenc-lab bench overhead --help: what a training step costs beyond the model's forward, backward "
        "and optimizer step.",
    )
    p.add_argument(
        "--configs",
        default="small",
        help=f"comma-separated model presets of conf/model/ ({','.join(model_presets())}; default: small)",
    )
    p.add_argument("--segment-len", type=int, default=None, help="tokens per segment (default: the preset's mem_len)")
    p.add_argument("--batch", type=int, default=None, help="streams per step (default: 2048 tokens per step)")
    p.add_argument(
        "--model-set",
        type=parse_assignments,
        default={},
        metavar="K=V,...",
        help="override preset fields, e.g. n_layer=2,mem_len=64",
    )
    p.add_argument(
        "--schemes",
        default="all",
        help="comma-separated scheme names, or 'all' (default); a scheme with options in brackets, ';' between "
        "them: 'rope[scaling=dynamic;original_len=128;factor=4],sinusoid[softmax_scale=ssmax]' (its own options and "
        "the model's softmax_scale, attention_sink, output_gate; each point named by its label, e.g. sinusoid+ssmax, "
        "rope+sink: bench/schemes.py)",
    )
    p.add_argument("--precisions", default="fp32", help=f"comma-separated, from {','.join(PRECISIONS)}")
    p.add_argument("--memory", default="both", choices=["both", "on", "off"], help="with memory, without, or both")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU; default or 0: torch's)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before timing")
    p.add_argument("--reps", type=int, default=5, help="timed steps; the median is quoted")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the whole grid this many times, in alternating order; the table gives the median of each "
        "figure and, with --ratio-to, each ratio's lowest and highest value over the rounds (_min, _max; "
        "paired within a round)",
    )
    p.add_argument(
        "--compile",
        nargs="?",
        const="on",
        default="off",
        choices=["off", "on", "both"],
        help="torch.compile the model: off (default), on (--compile alone), both (compiled vs eager, with "
        "compile_s and eval_compile_s, the first steps' extra time, and train_1000_ratio, a 1,000-step run with its "
        "evaluation compiled over eager)",
    )
    p.add_argument(
        "--compile-mode",
        default="default",
        choices=COMPILE_MODES,
        help="torch.compile's mode for the compiled points: default, reduce-overhead (CUDA graphs: the step replayed "
        "as one launch; on a CPU it compiles as default), max-autotune, max-autotune-no-cudagraphs",
    )
    p.add_argument(
        "--attention",
        default="auto",
        help=f"comma-separated model.attention_impl values, from {','.join(IMPLS)} (fused vs unfused: "
        "fused,unfused); a loop the fused path cannot run here (CPU training) is reported as NaN",
    )
    p.add_argument(
        "--ratio-to",
        default=None,
        metavar="SCHEME",
        help="add columns train_ratio, train_cpu_ratio, eval_ratio, eval_cpu_ratio: each step time over "
        "SCHEME's at the same config, precision, memory, compile and attention (SCHEME: a point's label)",
    )
    p.add_argument(
        "--matmul-max-n",
        type=int,
        default=None,
        help="largest square matmul for the peak (default 2048 on CPU, 8192 on CUDA)",
    )
    p.add_argument("--out", type=Path, default=None, help="write bench.csv and bench.md (and eval_speed.*) here")
    p.add_argument(
        "--eval-speed",
        action="store_true",
        help="instead: evaluation with memory reuse vs a sliding window at --attention-len",
    )
    p.add_argument("--attention-len", default="800", help="comma-separated attention lengths for --eval-speed")
    p.add_argument("--eval-segment-len", type=int, default=128, help="segment length of memory-reuse evaluation")
    p.add_argument("--eval-batch", type=int, default=4, help="streams (windows) per forward in --eval-speed")
    return p


def device_problem(device: str) -> str | None:
    """Why --device cannot run here, or None: auto, cpu, or a CUDA device this machine has."""
    if device == "auto":
        return None
    try:
        chosen = torch.device(device)
    except (RuntimeError, ValueError):
        chosen = None
    if chosen is None or chosen.type not in ("cpu", "cuda"):
        return f"--device {device!r} is not a device; valid: auto, cpu, cuda, cuda:N"
    count = torch.cuda.device_count() if chosen.type == "cuda" and torch.cuda.is_available() else 0
    if chosen.type == "cuda" and not count:
        return f"--device {device}: this machine has no CUDA device (torch.cuda.is_available() is false); use cpu"
    if chosen.type == "cuda" and chosen.index is not None and chosen.index >= count:
        return f"--device {device}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
    return None


#: integer options and their least valid value (None: the option's default, which is always valid)
COUNTS = {
    "segment_len": 1,
    "batch": 1,
    "threads": 0,
    "warmup": 0,
    "reps": 1,
    "matmul_max_n": 1,
    "eval_segment_len": 1,
    "eval_batch": 1,
}


def size_problem(args: argparse.Namespace, bc: BenchConfig, cfg: ModelConfig) -> str | None:
    """One line if a point of the grid (``cfg`` at ``bc``'s lengths: a training and an evaluation step; with
    --eval-speed its memory-reuse and sliding-window passes instead) cannot fit on --device (``footprint``)."""
    sizes = [k for k in (*MODEL_SIZES, "mem_len") if getattr(cfg, k) is not None]
    options = {k: (f"--model-set {k}", getattr(cfg, k)) for k in sizes}
    train = Shape(bc.batch_size, bc.segment_len, cfg.mem_len)
    evals = [train]
    if args.eval_speed:
        train, A = None, max(int(a) for a in _csv_list(args.attention_len))
        cfg = bc.model_config(cfg.posenc, memory=False, segment_len=A + 1)  # as measure_eval_speed builds it
        evals = [Shape(args.eval_batch, args.eval_segment_len, A), Shape(args.eval_batch, A + 1, 0)]
        longer = ("--eval-segment-len", args.eval_segment_len) if args.eval_segment_len > A else ("--attention-len", A)
        options |= {
            "mem_len": ("--attention-len", A),
            "segment_len": longer,
            "batch": ("--eval-batch", args.eval_batch),
        }
    else:
        options |= {"segment_len": ("--segment-len", bc.segment_len), "batch": ("--batch", bc.batch_size)}
    return fit_problem(cfg, train, evals, str(pick_device(args.device)), options, what="this point")


def option_problems(args: argparse.Namespace, presets: list[str], schemes: list[SchemeSpec]) -> list[str]:
    """Why the numbers, --device, --out, --model-set or a scheme's options cannot run, each naming the option and
    what is valid (names unknown to the project are listed by ``main``)."""
    out = [
        f"--{name.replace('_', '-')} must be an integer >= {low}, got {getattr(args, name)}"
        for name, low in COUNTS.items()
        if getattr(args, name) is not None and getattr(args, name) < low
    ]
    lengths = _csv_list(args.attention_len)
    if not lengths or not all(a.isdigit() and int(a) >= 1 for a in lengths):
        out.append(f"--attention-len must be integers >= 1, comma-separated, got {args.attention_len!r}")
    if (problem := device_problem(args.device)) is not None:
        out.append(problem)
    if args.out is not None and (problem := path_problem(args.out, "--out")) is not None:
        out.append(problem)
    labels = [s.label for s in schemes]
    if twice := sorted({x for x in labels if labels.count(x) > 1}):
        out.append(f"--schemes names the point(s) {twice} more than once; give each scheme and options once")
    if args.eval_speed and (given := [s.text for s in schemes if s.given]):
        out.append(f"--eval-speed takes scheme names without options, got {given}")
    if out or (problem := next((p for s in schemes if (p := s.problem())), None)):
        return out or [problem]
    for name in presets:  # each model of the grid, built as a config: a size that cannot be one is named
        bc = BenchConfig.preset(name, args.segment_len, args.batch, **args.model_set)
        for spec, memory in itertools.product(schemes, (True, False)):
            try:
                cfg = bc.model_config(spec.scheme, memory, **spec.model)
            except ValueError as e:
                given = ",".join(f"{k}={v}" for k, v in args.model_set.items())
                return [f"--model-set {given} with --configs {name}: {e}"]
            if problem := size_problem(args, bc, cfg):  # before any scheme is built
                return [f"--configs {name} with --schemes {spec.text}: {problem}"]
            if spec.given:  # the scheme built with its options: what only the build can judge (longrope's lists)
                try:
                    cfg = bc.model_config(spec.scheme, memory, options=spec.options, **spec.model)
                    build_scheme(cfg.posenc, cfg.dims, **cfg.posenc_kwargs).validate(bc.segment_len, cfg.mem_len)
                except ValueError as e:
                    return [f"--schemes {spec.text} with --configs {name}: {e}"]
    return out


def main(argv: list[str] | None = None, omp_policy_applies: bool | None = None) -> int:
    """``omp_policy_applies``: whether OMP_WAIT_POLICY was set before torch loaded (None: not known)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["overhead"]:  # the training step outside the model: its own options
        from .overhead import main as overhead_main

        return overhead_main(argv[1:])
    args = build_parser().parse_args(argv)
    presets = _csv_list(args.configs)
    names = scheme_names()
    try:
        specs = parse_schemes(args.schemes, names)
    except ValueError as e:
        print(f"posenc-lab bench: error: {e}", file=sys.stderr)
        return 2
    schemes = [s.label for s in specs]
    precisions = _csv_list(args.precisions)
    unknown = [c for c in presets if c not in model_presets()]
    unknown += [s.text for s in specs if s.scheme not in names]
    unknown += [p for p in precisions if p not in PRECISIONS]
    unknown += [k for k in args.model_set if k not in ModelConfig.__dataclass_fields__]
    attention = _csv_list(args.attention)
    unknown += [a for a in attention if a not in IMPLS]
    if args.rounds < 1 or (args.rounds > 1 and args.eval_speed):
        unknown.append(f"--rounds {args.rounds} (at least 1; --eval-speed runs one round)")
    if args.ratio_to is not None and args.ratio_to not in schemes:
        unknown.append(f"--ratio-to {args.ratio_to} (not among --schemes)")
    if unknown:
        print(
            f"posenc-lab bench: error: unknown {unknown}; configs (conf/model/): {list(model_presets())}, schemes: "
            f"{list(names)}, precisions: {list(PRECISIONS)}, --attention: {list(IMPLS)}, "
            f"--model-set keys: ModelConfig fields",
            file=sys.stderr,
        )
        return 2
    if problems := option_problems(args, presets, specs):
        print(f"posenc-lab bench: error: {'; '.join(problems)}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    configs = {name: BenchConfig.preset(name, args.segment_len, args.batch, **args.model_set) for name in presets}
    env = environment_line(omp_policy_applies)
    header = f"{env}\n\n`posenc-lab bench {' '.join(argv)}`"
    print(env)
    if args.eval_speed:
        rows = []
        for name, bc in configs.items():
            for s in [spec.scheme for spec in specs] if args.schemes != "all" else [ModelConfig.posenc]:
                for p in precisions:
                    for A in (int(a) for a in _csv_list(args.attention_len)):
                        r = {
                            "config": name,
                            **measure_eval_speed(
                                bc, A, args.eval_segment_len, args.eval_batch, scheme=s, precision=p, device=args.device
                            ),
                        }
                        rows.append(r)
                        print(text_row(r))
        print(text_table(rows))
        if args.out:
            write_table(rows, args.out / "eval_speed", header)
        return 0
    memory = {"both": (True, False), "on": (True,), "off": (False,)}[args.memory]
    compile = {"off": (False,), "on": (True,), "both": (False, True)}[args.compile]
    rounds, results = [], []
    for n in range(args.rounds):
        if args.rounds > 1:
            print(f"round {n + 1}/{args.rounds}", flush=True)
        done = run_benchmark(
            configs,
            specs[::-1] if n % 2 else specs,  # odd rounds backwards: no scheme always runs first
            precisions,
            memory,
            args.device,
            args.warmup,
            args.reps,
            compile,
            log=lambda line: print(line, flush=True),
            compile_mode=args.compile_mode,
            matmul_max_n=args.matmul_max_n,
            attention=attention,
        )
        rows = [r.row() for r in done]
        if args.compile == "both":
            rows = add_compile_cost(rows)
        rounds.append(add_ratios(rows, args.ratio_to) if args.ratio_to is not None else rows)
        results += done
        if args.out and args.rounds > 1:  # each round as it ends: its own figures (the first pays cold compiles)
            write_table(rounds[-1], args.out / f"bench_round{n + 1}", f"{header}\n\nround {n + 1}/{args.rounds}")
    rows = combine_rounds(rounds) if args.rounds > 1 else rounds[0]
    for point, why in {r.point: r.extra["not_run"] for r in results if "not_run" in r.extra}.items():
        print(f"{point}: not run: {why}")
    print()
    print(text_table(rows))
    if results:
        print(f"peak memory: {results[0].extra['memory_method']}")
    if args.out:
        paths = write_table(rows, args.out / "bench", header)
        print(f"wrote {paths['csv']} and {paths['md']}")
    return 0

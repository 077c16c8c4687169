"""posenc-lab's xl against the original Transformer-XL code (kimiyoung/transformer-xl) on the same text: training
tokens/s of each, each in a process of its own, by interleaved rounds, and their ratio.

    git clone https://github.com/kimiyoung/transformer-xl /tmp/txl      # the reference: never part of this repository
    python benchmarks/txl_side_by_side.py --reference /tmp/txl --rounds 5

Two comparisons, every round (in alternating order):

- **each under its own defaults** (the fair one: as a user runs each program): ours as ``posenc-lab train`` runs,
  after the command's own settings (``prefer_passive_openmp``, ``keep_freed_memory``, ``flush_denormals``, set in
  its process before torch loads); the reference in this script's own environment, untouched.
- **the same settings** (labelled so): the reference under posenc-lab's settings too. It measures the settings as
  much as the code: the reference's step is much slower under them (docs/PERFORMANCE.md).

Each child process prints its environment (threads, OpenMP wait policy, the malloc setting) beside its figure.

Ours: a training step of ``posenc-lab train posenc=xl model=small`` (4 x 128, segment 128, memory 128, batch 16,
fp32, data=pystdlib), ``Trainer.fit`` as the command runs it (``posenc_lab/bench/overhead.py``: data loading,
Lightning's loop, callbacks and logging included). Extra arguments are Hydra overrides of ours; the reference is
built to the same sizes. The reference: its ``train.py`` step (batch_chunk 1, no fp16: zero_grad, forward with the
memory, the mean loss, backward, ``loss.item()``, clipping at 0.25, Adam, the cosine schedule), its
``MemTransformerLM`` (attn_type 0, the relative attention of the paper) and its ``LMOrderedIterator`` over the same
corpus's training tokens. It is copied to a temporary folder with two fixes for today's PyTorch, its code otherwise
run as it is: its attention masks are made boolean (``masked_fill`` refuses ``.byte()`` masks) and its adaptive-
softmax module no longer parses the CUDA version at import (None in a CPU build). ``--reference`` takes a checkout
or a bare git repository (read at HEAD).

Each figure is the mean over ``--steps`` steps after ``--warmup``; a ratio (ours over the reference, tokens/s) is
each round's own, and the summary gives its median with the lowest and highest round.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: what a child process prints its figures after (one JSON line)
RESULT = "txl_side_by_side result: "
#: the environment variables a CPU timing depends on, printed for each child
SETTINGS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MALLOC_MMAP_MAX_", "GLIBC_TUNABLES")

#: the reference's files this runs, and the fixes each needs (old text -> new text)
FILES = {
    "pytorch/mem_transformer.py": [(".byte()", ".bool()"), ("sys.path.append('utils')", "")],
    "pytorch/data_utils.py": [],
    "pytorch/utils/proj_adaptive_softmax.py": [("torch.version.cuda.split", "(torch.version.cuda or '0.0').split")],
    "pytorch/utils/log_uniform_sampler.py": [],
    "pytorch/utils/vocabulary.py": [],
    "pytorch/utils/__init__.py": [],
}


def reference_problem(path: Path) -> str | None:
    """Why ``path`` is not a copy of kimiyoung/transformer-xl, or None."""
    if (path / "pytorch" / "mem_transformer.py").is_file():
        return None
    if (path / "HEAD").is_file():
        shown = subprocess.run(["git", "--git-dir", str(path), "cat-file", "-e", "HEAD:pytorch/mem_transformer.py"])
        if shown.returncode == 0:
            return None
    return f"--reference {path}: no pytorch/mem_transformer.py there (a kimiyoung/transformer-xl checkout, or its .git)"


def _read(path: Path, name: str) -> str | None:
    if (path / "pytorch").is_dir():
        file = path / name
        return file.read_text() if file.is_file() else None
    shown = subprocess.run(["git", "--git-dir", str(path), "show", f"HEAD:{name}"], capture_output=True, text=True)
    return shown.stdout if shown.returncode == 0 else None


def load_reference(path: Path, into: Path):
    """The reference's (MemTransformerLM, LMOrderedIterator), from a patched copy of its files in ``into``."""
    for name, fixes in FILES.items():
        text = _read(path, name)
        if text is None:
            text = ""  # utils/__init__.py does not exist in every version: a namespace package then
        for old, new in fixes:
            if old not in text:
                raise SystemExit(f"txl_side_by_side: {name} of {path} has no {old!r}: not the expected version")
            text = text.replace(old, new)
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        (into / name).write_text(text)
    sys.path[:0] = [str(into / "pytorch"), str(into / "pytorch" / "utils")]
    model, data = importlib.import_module("mem_transformer"), importlib.import_module("data_utils")
    return model.MemTransformerLM, data.LMOrderedIterator


def time_reference(cfg, model_cls, iterator_cls, warmup: int, steps: int, seed: int = 0):
    """Seconds per step (wall, process CPU) of the reference's training step at ``cfg``'s sizes (module doc)."""
    import torch

    from posenc_lab.build import build_datamodule

    torch.manual_seed(seed)
    m, data = cfg.model, build_datamodule(cfg.data)
    L_, B, M = int(cfg.data.segment_len), int(cfg.data.batch_size), int(m.mem_len)
    model = model_cls(
        data.vocab_size, m.n_layer, m.n_head, m.d_model, m.d_model // m.n_head, m.d_inner, m.dropout, m.attn_dropout,
        tie_weight=True, d_embed=m.d_model, pre_lnorm=bool(m.pre_norm), tgt_len=L_, ext_len=0, mem_len=M,
        same_length=bool(m.same_length), attn_type=0,
    )  # fmt: skip
    model.train()
    tokens = torch.from_numpy(data.corpus.train.astype("int64"))
    batches = iter(iterator_cls(tokens, B, L_, device="cpu", ext_len=0))
    optimizer = torch.optim.Adam(model.parameters(), lr=2.5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, warmup + steps, eta_min=0.0)
    mems, train_loss, marks = tuple(), 0.0, []
    for i in range(warmup + steps + 1):
        if i in (warmup, warmup + steps):
            marks.append((time.perf_counter(), time.process_time()))
        if i == warmup + steps:
            break
        x, y, _ = next(batches)
        model.zero_grad()  # its train.py, batch_chunk 1, no fp16
        ret = model(x, y, *mems)
        loss, mems = ret[0], ret[1:]
        loss = loss.float().mean().type_as(loss)
        loss.backward()
        train_loss += loss.float().item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        scheduler.step()
    (w0, c0), (w1, c1) = marks
    return (w1 - w0) / steps, (c1 - c0) / steps


def child(side: str, settings: str, reference: Path, warmup: int, steps: int, extra: list[str]) -> None:
    """One side's figure in this process: ``posenc-lab``'s settings applied first where ``settings`` says (always
    for ours, as the command applies them), then torch loaded; prints RESULT and a JSON line."""
    from posenc_lab import flush_denormals, keep_freed_memory, prefer_passive_openmp

    if side == "ours" or settings == "posenc-lab":
        prefer_passive_openmp()  # before torch loads, as cli.py does
        keep_freed_memory()
        flush_denormals()
    import torch

    from posenc_lab.bench.overhead import overrides, time_fit
    from posenc_lab.compose import compose

    with tempfile.TemporaryDirectory(prefix="txl_side_") as tmp:
        cfg = compose("train", overrides("small", warmup, steps, str(Path(tmp) / "run"), extra))
        if side == "ours":
            wall, cpu = time_fit(cfg, warmup, steps)[:2]
        else:
            wall, cpu = time_reference(cfg, *load_reference(reference, Path(tmp)), warmup, steps)
    env = {k: os.environ.get(k, "unset") for k in SETTINGS}
    tokens = int(cfg.data.batch_size) * int(cfg.data.segment_len)
    print(RESULT + json.dumps({"wall_s": wall, "cpu_s": cpu, "tokens": tokens, "threads": torch.get_num_threads(),
                               "posenc_lab_settings": side == "ours" or settings == "posenc-lab", **env}),
          flush=True)  # fmt: skip


def run_child(side: str, settings: str, args, extra: list[str]) -> dict:
    """Start ``child`` in a process of its own, in this process's environment (nothing of posenc-lab's set in it)."""
    command = [sys.executable, __file__, "--child", side, "--settings", settings, "--reference", str(args.reference),
               "--warmup", str(args.warmup), "--steps", str(args.steps), *extra]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"txl_side_by_side: the {side} process failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT) :])


#: (side, settings) of each child of a round: ours runs under its own settings only
CHILDREN = (("ours", "own"), ("reference", "own"), ("reference", "posenc-lab"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="txl_side_by_side", description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", type=Path, required=True, help="kimiyoung/transformer-xl: a checkout or its .git")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="timed steps a round (a multiple of log_every_n_steps)")
    p.add_argument("--child", choices=["ours", "reference"], help=argparse.SUPPRESS)
    p.add_argument("--settings", choices=["own", "posenc-lab"], default="own", help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="Hydra overrides of ours (default: posenc=xl model=small)")
    args = p.parse_args(argv)
    extra = ["posenc=xl", "trainer.accelerator=cpu", *args.overrides]
    if args.child:
        child(args.child, args.settings, args.reference, args.warmup, args.steps, extra)
        return 0
    from posenc_lab.compose import override_problem  # no torch in this process: the children load it

    if problem := reference_problem(args.reference):
        print(f"txl_side_by_side: {problem}", file=sys.stderr)
        return 2
    bad = [f"--{k} {getattr(args, k)}: at least 1" for k in ("rounds", "warmup", "steps") if getattr(args, k) < 1]
    if not bad and (problem := override_problem("train", args.overrides, "train")):
        bad.append(problem)
    if bad:
        print(f"txl_side_by_side: {'; '.join(bad)}", file=sys.stderr)
        return 2
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    mine = "  ".join(f"{k}={os.environ.get(k, 'unset')}" for k in SETTINGS)
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')}  {os.cpu_count()} CPUs  load avg {load}  this process: {mine}")
    rows = []
    for n in range(args.rounds):
        figures = {}
        for side, settings in CHILDREN if n % 2 == 0 else CHILDREN[::-1]:
            figures[side, settings] = got = run_child(side, settings, args, args.overrides)
            env = "  ".join(f"{k}={got[k]}" for k in ("threads", *SETTINGS[1:3]))
            print(f"round {n + 1}  {side:9s} {settings:10s} settings  {got['wall_s'] * 1e3:7.1f} ms a step "
                  f"({got['tokens'] / got['wall_s']:,.0f} tokens/s)  {env}", flush=True)  # fmt: skip
        ours = figures["ours", "own"]
        rows.append({
            "round": n + 1,
            "ours_ms": ours["wall_s"] * 1e3,
            "reference_own_ms": figures["reference", "own"]["wall_s"] * 1e3,
            "reference_same_ms": figures["reference", "posenc-lab"]["wall_s"] * 1e3,
            "ratio_own": figures["reference", "own"]["wall_s"] / ours["wall_s"],
            "ratio_own_cpu": figures["reference", "own"]["cpu_s"] / ours["cpu_s"],
            "ratio_same": figures["reference", "posenc-lab"]["wall_s"] / ours["wall_s"],
            "ratio_same_cpu": figures["reference", "posenc-lab"]["cpu_s"] / ours["cpu_s"],
        })  # fmt: skip
    from posenc_lab.tables import text_table

    print()
    print(text_table(rows))
    labels = {
        "ratio_own": "each under its own defaults (the fair comparison)",
        "ratio_own_cpu": "each under its own defaults, by process CPU time",
        "ratio_same": "both under posenc-lab's settings (not the reference's own)",
        "ratio_same_cpu": "both under posenc-lab's settings, by process CPU time",
    }
    for key, label in labels.items():
        values = [r[key] for r in rows]
        print(f"{key}: median {statistics.median(values):.2f}x, rounds {min(values):.2f}-{max(values):.2f}x "
              f"(ours over the reference, tokens/s; {label})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``posenc-lab compare A B``: is my variant better than the baseline? Each side is a run directory, or a folder
of runs equal but for their seed (a cell). Every run is evaluated as trained on the same tokens of
the val split (``--split test`` on request: the test split is the report's, kept for the verdicts), by
``dumps.as_trained``, and the difference of the two sides' mean loss is given with its interval, seeds and the
text's independent units (families on a corpus split by family, documents elsewhere) as the units
(``stats.paired_difference``), beside each side's own figure.

    posenc-lab compare runs/my_variant runs/baseline
    posenc-lab compare runs/ablate/ablation/runs/xl_mem32_full_seed0 runs/ablate/ablation/runs/xl_mem0_full_seed0

Refused, with the reason, before any evaluation: sides of different corpora or tokenizers (vocabulary, unit,
the corpus's SHA-256 in run.json), a folder whose runs differ by more than their seed (and the keys whose value
derives from it, ``data.seed: ${seed}``), and sides that are one run or folder, share a run, or where one holds a copy
of a run of the other (``cp -r``: the same configuration, seed and checkpoint).
"""

from __future__ import annotations

import argparse
import copy
import functools
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from posenc_lab.build import model_config
from posenc_lab.compose import compose, derived_keys
from posenc_lab.footprint import Shape, fit_problem
from posenc_lab.io import path_problem
from posenc_lab.metrics import figure, figure_name, figure_scale
from posenc_lab.rundir import RunDir, differences

from .dumps import AsTrained, as_trained, same_tokens, stack
from .runs import Run, RunError, add_threads_argument, analysis_device, apply_threads, find_runs
from .settings import conf_block, structured
from .stats import Difference, mean_interval, p_text, paired_difference


def side(path: Path) -> list[Run]:
    """The runs of one side: one run, or a folder of runs equal but for their seed and what derives from it
    (``seed_keys``: ``data.seed`` is ``${seed}``)."""
    runs = find_runs([path])
    if len(runs) > 1:
        first, first_keys = RunDir(runs[0].path).identity() or {}, seed_keys(runs[0])
        for r in runs[1:]:
            keys = first_keys & seed_keys(r)  # derived in both: a key one run fixed differs by more than the seed
            diff = differences(_cleared(first, keys), _cleared(RunDir(r.path).identity() or {}, keys))
            if diff:
                raise RunError(
                    f"{path} holds runs that differ by more than their seed ({runs[0].name} vs {r.name}: "
                    f"{'; '.join(diff[:4])}); give one run or a folder of one cell's seeds"
                )
        if copy_of := copies(runs, runs):  # one seed counted twice
            first, second, digest = copy_of
            raise RunError(
                f"{path} holds one run twice: {first.path} and {second.path}, one a copy of the other (the same "
                f"configuration, seed and checkpoint, SHA-256 {digest[:16]}...); give one run or a folder of one "
                f"cell's seeds, each once"
            )
    return runs


def sides(path_a: Path, path_b: Path) -> tuple[list[Run], list[Run]]:
    """Both sides' runs; RunError if they are one run or folder, share a run, or B holds a copy of a run of A
    (``copies``): a difference of a run with itself, whose interval has no spread ("t with inf df")."""
    valid = "compare two different runs or cells (a run directory, or a folder of one cell's seeds, on each side)"
    if path_a.exists() and path_b.exists() and os.path.samefile(path_a, path_b):
        raise RunError(
            f"A and B are the same {'run' if RunDir(path_a).config_file.is_file() else 'folder'} ({path_a}); {valid}"
        )
    a, b = side(path_a), side(path_b)
    shared = sorted({r.path.resolve() for r in a} & {r.path.resolve() for r in b})
    if shared:
        raise RunError(f"A ({path_a}) and B ({path_b}) both hold the run {shared[0]}; {valid}")
    if copy_of := copies(a, b):
        ra, rb, digest = copy_of
        raise RunError(
            f"B's run {rb.path} is a copy of A's run {ra.path}: the same configuration and seed (run.json) and the "
            f"same checkpoint ({RunDir.LAST}, SHA-256 {digest[:16]}...), so the same run; {valid}"
        )
    return a, b


def copies(a: list[Run], b: list[Run]) -> tuple[Run, Run, str] | None:
    """A run of ``b`` that is a copy of a run of ``a`` (``cp -r``): the same identity (configuration, seed and
    corpus: run.json) and a checkpoint of the same bytes, as (run of a, run of b, the checkpoint's SHA-256); else
    None. The weights are what is evaluated, so only the same bytes make the same run: a rerun of the same seed
    saves other bytes (its wall time at least) and is compared. A checkpoint is hashed only where the identities and
    the checkpoints' sizes agree."""
    identities = {id(r): json.dumps(RunDir(r.path).identity(), sort_keys=True, default=str) for r in (*a, *b)}
    for ra in a:
        for rb in b:
            if ra is rb or identities[id(ra)] != identities[id(rb)] or identities[id(ra)] == "null":
                continue
            if ra.checkpoint.stat().st_size == rb.checkpoint.stat().st_size:
                if (digest := _sha256(ra.checkpoint)) == _sha256(rb.checkpoint):
                    return ra, rb, digest
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def seed_keys(run: Run) -> set[str]:
    """The keys of a run's config that derive from its top-level seed, ``seed`` included (``compose.derived_keys``):
    from the config as it was composed (.hydra/config.yaml, written by ``posenc-lab train``), else from the
    project's config for the run's corpus (a run trained from Python)."""
    composed = RunDir(run.path).composed_config()
    return derived_keys(composed if composed is not None else _project_config(run.corpus_name))


@functools.cache
def _project_config(corpus: str) -> dict:
    try:
        cfg = compose("train", [f"data={corpus}"])
    except Exception:  # noqa: BLE001 - a corpus with no data/ option of its own (hf): the base they all inherit
        cfg = compose("train")
    return OmegaConf.to_container(cfg, resolve=False)


def _cleared(identity: dict, keys: set[str]) -> dict:
    """A copy of a run identity with these dotted keys set to None (``data.seed``; the identity's sections are the
    config's)."""
    out = copy.deepcopy(identity)
    for key in keys:
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node:
            node[leaf] = None
    return out


def comparable(a: list[Run], b: list[Run]) -> None:
    """RunError unless both sides score the same text with the same tokenizer."""
    ca, cb = ((RunDir(x[0].path).identity() or {}).get("corpus") or {} for x in (a, b))
    for key in ("name", "unit", "vocab_size", "sha256"):
        if ca.get(key) != cb.get(key):
            raise RunError(
                f"the sides were trained on other corpora or tokenizers: {key} {ca.get(key)!r} (A) vs "
                f"{cb.get(key)!r} (B); compare runs of one corpus"
            )
    if a[0].corpus_key != b[0].corpus_key:
        raise RunError(f"the sides use other corpus options: {a[0].corpus_key} (A) vs {b[0].corpus_key} (B)")


def figure_text(mean: Difference, unit: str, digits: int = 4) -> str:
    """A side's mean loss (nats) and its interval as the corpus's own figure (``metrics.figure``: bits per byte or
    character, perplexity of words): each end mapped, the figure rising with the loss."""
    if not np.isfinite(mean.estimate):
        return "n/a"
    estimate, low, high = (float(figure(x, unit)) for x in (mean.estimate, mean.low, mean.high))
    return f"{estimate:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def option_problems(args: argparse.Namespace) -> list[str]:
    """Why the command line's numbers or --out cannot be used, each naming the option and what is valid."""
    out = [
        f"--{name.replace('_', '-')} must be an integer >= 1, got {getattr(args, name)}"
        for name in ("n_streams", "n_tokens")
        if getattr(args, name) < 1
    ]
    if not 0 < args.level < 1:
        out.append(f"--level must be a confidence level in (0, 1), got {args.level}")
    if args.out is not None and (problem := path_problem(args.out, "--out")):
        out.append(problem)
    return out


def size_problem(runs: list[Run], settings: AsTrained) -> str | None:
    """One line if evaluating a run as trained (``settings.n_streams`` streams of its segments and memory) cannot fit
    on the analysis device (``posenc_lab.footprint``), before any run is loaded."""
    for r in runs:
        vocab = ((RunDir(r.path).identity() or {}).get("corpus") or {}).get("vocab_size")
        try:
            cfg = model_config(OmegaConf.create(r.config), int(vocab or 256))
        except (TypeError, ValueError, KeyError):
            continue  # a run that cannot be read so is named when it is loaded
        shape = Shape(settings.n_streams, min(r.segment_len, settings.n_tokens + 1), r.mem_len)
        options = {"batch": ("--n-streams", settings.n_streams), "segment_len": ("--n-tokens", settings.n_tokens)}
        if problem := fit_problem(cfg, None, [shape], analysis_device(), options, what=f"evaluating {r.path}"):
            return problem
    return None


def compare(a: list[Run], b: list[Run], settings: AsTrained, split: str, work: Path, level: float, log=print) -> dict:
    """The difference of the sides' mean loss (``difference``, in ``unit``: bits or nats per token) and each side's
    mean loss in nats (``a``, ``b``; ``figure_text`` gives the corpus's figure)."""
    comparable(a, b)
    if problem := size_problem(a + b, settings):
        raise RunError(problem)
    dumps = {}
    for name, runs in (("A", a), ("B", b)):
        for r in runs:
            log(f"  evaluating {name}: {r.label} ({r.path})")
            dumps[str(r.path)] = as_trained(r, settings, split, work / f"{name}_{r.name}.npz", log)
    units = same_tokens(dumps)
    xa, xb = stack([dumps[str(r.path)] for r in a]), stack([dumps[str(r.path)] for r in b])
    unit = a[0].unit
    unit_name, scale = figure_scale(unit)
    return {
        "figure": figure_name(unit),
        "unit": unit_name,
        "corpus_unit": unit,
        "a": mean_interval(xa, units, level),
        "b": mean_interval(xb, units, level),
        "difference": paired_difference(xa, xb, units, level).scaled(scale),
        "tokens": len(units),
        "units": len(np.unique(units)),
        "unit_kind": a[0].corpus().units_name(split),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="posenc-lab compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("a", type=Path, help="a run directory, or a folder of one cell's seeds")
    p.add_argument("b", type=Path, help="the baseline: a run directory, or a folder of one cell's seeds")
    d = structured(AsTrained, conf_block("trained"), "ablate.analysis.trained")  # the report's as-trained sample
    split, level = "val", conf_block("level")  # iterating on a variant reads val; the report's split is test
    p.add_argument("--split", default=split, choices=("val", "test"), help=f"the held-out text (default: {split})")
    p.add_argument("--n-streams", type=int, default=d.n_streams, help="streams spread over the split")
    p.add_argument("--n-tokens", type=int, default=d.n_tokens, help="scored tokens per stream")
    p.add_argument("--level", type=float, default=level, help=f"the interval's confidence level (default: {level})")
    p.add_argument("--out", type=Path, help="keep the per-token dumps here (default: a temporary folder)")
    add_threads_argument(p)
    args = p.parse_args(argv)
    if problems := option_problems(args):
        print(f"posenc-lab compare: error: {'; '.join(problems)}", file=sys.stderr)
        return 2
    apply_threads(args.threads)
    try:
        a, b = sides(args.a, args.b)
        settings = AsTrained(args.n_streams, args.n_tokens)
        with tempfile.TemporaryDirectory() as tmp:
            r = compare(a, b, settings, args.split, args.out or Path(tmp), args.level)
    except (RunError, ValueError) as e:
        print(f"posenc-lab compare: error: {e}", file=sys.stderr)
        return 2
    d = r["difference"]
    for name, path, runs in (("A", args.a, a), ("B", args.b, b)):
        shown = figure_text(r[name.lower()], r["corpus_unit"]) + _text_only(r[name.lower()])
        print(f"{name}: {path} ({len(runs)} seed(s)): {args.split} {r['figure']} {shown}")
    over = f"over seeds and {r['units']}" if d.covers_seeds else f"over {r['units']}"
    print(
        f"A - B: {d.text(4)} {r['unit']}{_text_only(d)} ({d.level:.0%} interval {over} {r['unit_kind']}, "
        f"{r['tokens']:,} tokens; t with {d.df:.1f} df); one-sided p that A is lower: "
        f"{p_text(d.p_value('<0'), d.df)}, higher: {p_text(d.p_value('>0'), d.df)}"
    )
    return 0


def _text_only(d: Difference) -> str:
    """The label of an interval that covers the evaluation text alone (a side of one seed: it leaves out the
    seed-to-seed spread, and covers far less than its level of the seed-inclusive truth)."""
    return "" if d.covers_seeds or not np.isfinite(d.estimate) else " (one seed: the text only, no seed variation)"


if __name__ == "__main__":
    sys.exit(main())

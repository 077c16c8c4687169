"""The grid of an ablation preset: which runs, with which overrides, and what each needs (reuse, resume, train).

Every run is composed exactly as
``posenc-lab train experiment=NAME <your overrides> posenc=S model.mem_len=M model.loss_recent_frac=F seed=S``
into ``<ablate.out>/runs/<scheme>_mem<M>_<loss>_seed<S>/`` (``posenc_lab.rundir.run_folder``); its cell is the
``cellnames.CellName`` of those settings (``cellnames.HasCell``). The runs go to the grid runner as trials.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict

from ..build import build_datamodule
from ..cellnames import MARKS, WINDOW_KEY, CellPattern, HasCell, loss_label
from ..checks import problems
from ..compose import compose, quote
from ..data import check_corpus_options
from ..data.lengthgen import TASKS
from ..defaults import group_options
from ..grid import Trial
from ..io import CorruptFileError
from ..positional import scheme_names
from ..rundir import RunDir, RunDirError, corpus_identity, differences, run_identity


@dataclass
class RunSpec(HasCell):  # cell_name, cell, label: cellnames.HasCell
    """A run of the grid: its cell's settings, its seed, and its trial for the grid runner (``posenc_lab.grid``)."""

    name: str
    group: str | None  # None: the main corpus; "recall": the recall probe; a task's name (ablate.tasks)
    scheme: str
    mem_len: int
    loss_frac: float
    overrides: list[str]
    seed: int = 0
    random_positions: int | None = None  # +model.random_positions=P (ablate.tasks.random_positions)
    posenc: dict | None = None  # its posenc node where it names the cell (a hybrid, DroPE): ``posenc_node``
    model_options: dict | None = None  # the model options that name the cell (cellnames.MARKS): S+ssmax, S+sink
    window: int = 0  # W > 0: trained without memory at segment W = L + M (ablate.same_span): the cell S:win<W>

    @property
    def trial(self) -> Trial:
        return Trial(self.name, tuple(self.overrides))


def experiment_of(overrides: Sequence[str]) -> str:
    for o in overrides:
        if o.startswith("experiment="):
            return o.split("=", 1)[1]
    return "ablation"


def train_overrides(overrides: Sequence[str]) -> list[str]:
    """The user's overrides that concern training (not the ablate block)."""
    return [o for o in overrides if not o.lstrip("+~").startswith("ablate.") and not o.startswith("experiment=")]


def _int_list(value, key: str) -> list[int]:
    items = list(value or [])
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in items) or len(set(items)) != len(items):
        raise ValueError(f"ablate: {key} must be a list of distinct integer seeds, got {items}")
    return items


def scheme_entry(entry: str) -> tuple[str, list[str]]:
    """(the scheme or preset of conf/posenc/, its overrides) of an entry of ``ablate.*.schemes``: ``S`` or ``S``
    followed by marks (``cellnames.MARKS``), each a model option: ``S+ssmax`` (``model.softmax_scale=ssmax``),
    ``S+sink`` (``model.attention_sink=true``), ``S+gate`` (``model.output_gate=true``), ``S+sink+gate``; each its
    own cell beside ``S`` in one grid."""
    overrides = []
    while (mark := entry.rpartition("+")[2]) in MARKS and "+" in entry:
        overrides.insert(0, MARKS[mark][2])
        entry = entry.rpartition("+")[0]
    return entry, overrides


def _model_options(cfg: DictConfig, overrides: Sequence[str]) -> dict:
    """The model options that name a cell (``cellnames.MARKS``) of a run composed from ``cfg`` with ``overrides``
    after it (the last one setting each)."""
    keys = {f"model.{key}": key for key, _, _ in MARKS.values()}
    values = {key: OmegaConf.select(cfg, dotted, default=None) for dotted, key in keys.items()}
    for o in overrides:
        dotted, _, text = o.lstrip("+~").partition("=")
        if dotted in keys:
            values[keys[dotted]] = yaml.safe_load(text) if text else None
    return values


def _resolve_in(cfg: DictConfig, text: str) -> str:
    """Resolve the ${...} interpolations of ``text`` against ``cfg``."""
    if "${" not in text:
        return text
    node = OmegaConf.create(
        {"root": OmegaConf.to_container(cfg, resolve=False), "value": text.replace("${", "${root.")}
    )
    return str(node.value)


def plan(cfg: DictConfig, user: Sequence[str]) -> list[RunSpec]:
    """The grid: schemes x recurrence (full loss), the half-loss variants, the recall grid; each cell once per
    seed of ``ablate.seeds``, and the cells of ``ablate.extra_seed_cells`` also once per seed of
    ``ablate.extra_seeds``, ordered seed by seed (an interrupted job has first finished every cell once).
    Without memory: only the schemes of ``ablate.no_memory_schemes`` (null: all); the schemes of
    ``ablate.same_span`` also without memory at segment L + M (``same_span``). Bad settings raise ValueError
    before any training."""
    a = cfg.ablate
    base = [f"experiment={experiment_of(user)}", *train_overrides(user)]
    seeds = _int_list(a.get("seeds") if a.get("seeds") is not None else [int(cfg.seed)], "ablate.seeds")
    if not seeds:
        raise ValueError("ablate: ablate.seeds is empty; give at least one seed, e.g. ablate.seeds=[0]")
    extra_seeds = _int_list(a.get("extra_seeds"), "ablate.extra_seeds")
    extra_cells = [str(c) for c in a.get("extra_seed_cells") or []]
    extra = [CellPattern.parse(c, "ablate.extra_seed_cells") for c in extra_cells]
    no_memory = a.get("no_memory_schemes")
    valid = tuple(sorted({*scheme_names(), *group_options("posenc")}))  # a preset of conf/posenc/ too (irope)
    # "all", alone or as an entry of the list: every registered scheme there (the zoo: [all, rope+sink, ...])
    entries = ["all"] if a.schemes == "all" else list(a.schemes)
    schemes = list(dict.fromkeys(n for e in entries for n in (scheme_names() if e == "all" else [e])))
    named = {
        "ablate.schemes": schemes,
        "ablate.no_memory_schemes": list(no_memory or []),
        "ablate.half_loss.schemes": list((a.get("half_loss") or {}).get("schemes") or []),
        "ablate.recall.schemes": list((a.get("recall") or {}).get("schemes") or []),
        "ablate.tasks.schemes": list((a.get("tasks") or {}).get("schemes") or []),
        "ablate.same_span.schemes": list((a.get("same_span") or {}).get("schemes") or []),
    }
    for key, names in named.items():
        bad = [n for n in names if scheme_entry(n)[0] not in valid]
        if bad:
            raise ValueError(
                f"ablate: {key} names unknown scheme(s) {bad}; valid: {', '.join(valid)}, each alone or with "
                f"{', '.join(f'+{m}' for m in MARKS)} after it ({', '.join(o for *_, o in MARKS.values())})"
            )
    raw_overrides = OmegaConf.to_container(a.scheme_overrides, resolve=False) if a.get("scheme_overrides") else {}
    specs: list[RunSpec] = []

    def add(
        group,
        scheme: str,
        recurrent: bool,
        frac: float,
        head: list[str],
        mem: int,
        group_cfg: DictConfig,
        rand=None,
        window: tuple[int, list[str]] = (0, []),  # (W, its overrides): a window cell (``same_span``)
    ):
        M = mem if recurrent else 0
        W, window_overrides = window
        entry, (scheme, marks) = scheme, scheme_entry(scheme)  # S+ssmax: S with model.softmax_scale=ssmax
        # the overrides of the scheme, then those of the entry (ablate.scheme_overrides: {S: [...], S+ssmax: [...]})
        own = [*(raw_overrides.get(scheme) or []), *((raw_overrides.get(entry) or []) if entry != scheme else [])]
        per_scheme = [_resolve_in(group_cfg, o) for o in own] + marks
        node = posenc_node(tuple(head), scheme, tuple(per_scheme))
        model = _model_options(group_cfg, per_scheme)
        cell = RunSpec(
            "", group, scheme, M, frac, [], random_positions=rand, posenc=node, model_options=model, window=W
        ).cell_name
        for seed in dict.fromkeys([*seeds, *(extra_seeds if any(p.matches(cell) for p in extra) else [])]):
            overrides = [
                *head,
                f"posenc={scheme}",
                *per_scheme,
                *([f"+model.random_positions={rand}"] if rand is not None else []),
                f"model.mem_len={M}",
                *window_overrides,
                f"model.loss_recent_frac={frac}",
                f"seed={seed}",
            ]
            memory = f"win{W}" if W else f"mem{M}"
            name = f"{f'{group}_' if group else ''}{cell.scheme}_{memory}_{loss_label(frac)}_seed{seed}"
            specs.append(RunSpec(name, group, scheme, M, frac, overrides, seed, rand, node, model, W))

    mem = int(cfg.model.mem_len)
    if mem < 1 and any(a.recurrence):
        raise ValueError(
            f"ablate: the runs with memory need model.mem_len >= 1 in the preset (got {mem}); set model.mem_len or "
            f"ablate.recurrence=[false]"
        )
    check_corpus_options(cfg.data.name, cfg.data.get("corpus") or {})
    for scheme in schemes:
        for rec in a.recurrence:
            if rec or no_memory is None or scheme in no_memory:
                add(None, scheme, bool(rec), 1.0, base, mem, cfg)
    for scheme in (a.get("same_span") or {}).get("schemes") or []:
        add(None, scheme, False, 1.0, base, mem, cfg, window=same_span(cfg, mem))
    half = a.get("half_loss") or {}
    frac = half.get("frac")  # conf/ablate.yaml: 0.5, the paper's recent half
    if half.get("schemes") and (isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac < 1):
        raise ValueError(f"ablate.half_loss.frac must be a number in (0, 1) (model.loss_recent_frac), got {frac!r}")
    for scheme in half.get("schemes") or []:
        for rec in half.get("recurrence") or [True]:
            add(None, scheme, bool(rec), float(frac), base, mem, cfg)
    recall = a.get("recall") or {}
    if recall.get("schemes"):
        # the recall grid is defined by its own data: the user's data overrides are for the main grid only
        head = [
            f"experiment={recall.get('experiment') or 'recall'}",
            *[o for o in train_overrides(user) if not o.lstrip("+~").startswith("data")],
            *(recall.get("overrides") or []),
        ]
        rcfg = compose("train", head)
        check_corpus_options(rcfg.data.name, rcfg.data.get("corpus") or {})
        for scheme in recall.schemes:
            for rec in recall.get("recurrence") or [True, False]:
                if rec or no_memory is None or scheme in no_memory:
                    add("recall", scheme, bool(rec), 1.0, head, int(rcfg.model.mem_len), rcfg)
    _task_grid(a.get("tasks") or {}, user, no_memory, add)
    cells = list(dict.fromkeys(s.cell_name for s in specs))
    unknown = [c for c, p in zip(extra_cells, extra) if not any(p.matches(x) for x in cells)]
    if unknown:
        raise ValueError(
            f"ablate: ablate.extra_seed_cells names cells not in the grid: {unknown}; the grid's cells: "
            f"{', '.join(map(str, cells))}"
        )
    rank = {seed: i for i, seed in enumerate(dict.fromkeys([*seeds, *extra_seeds]))}
    specs.sort(key=lambda s: rank[s.seed])
    names = [s.name for s in specs]
    if len(set(names)) < len(names):
        raise ValueError(f"ablate: the grid names runs twice: {sorted({n for n in names if names.count(n) > 1})}")
    return specs


def same_span(cfg: DictConfig, mem: int) -> tuple[int, list[str]]:
    """(W, the overrides) of a window of the same span as the grid's memory cells: trained without memory at
    segment W = L + M (the attention span of a memory cell), with the batch cut by L / W so that a step trains on
    as many tokens as a memory cell's step (the same data, the same steps); marked ``WINDOW_KEY`` so that its cell
    is ``S:win<W>``. ValueError before any training where the batch cannot be cut evenly or there is no memory."""
    L, B = int(cfg.data.segment_len), int(cfg.data.batch_size)
    if mem < 1:
        raise ValueError(f"ablate.same_span: a window of the span L + M needs model.mem_len >= 1, got {mem}")
    W = L + mem
    if (B * L) % W:
        raise ValueError(
            f"ablate.same_span: data.batch_size={B} x L={L} tokens a step cannot be cut into segments of W = L + M = "
            f"{W}; choose a batch size that is a multiple of {W // math.gcd(L, W)}"
        )
    return W, [f"data.segment_len={W}", f"data.batch_size={B * L // W}", f"{WINDOW_KEY}=true"]


@functools.cache
def posenc_node(head: tuple[str, ...], scheme: str, per_scheme: tuple[str, ...]) -> dict | None:
    """The posenc node a run of ``scheme`` composes, where it names the cell: a preset of conf/posenc/ (a hybrid's
    layers) or overrides of posenc (``+posenc.drop_at_step=K``); None where the scheme's name alone does."""
    if scheme in scheme_names() and not any(o.lstrip("+~").startswith("posenc") for o in (*head, *per_scheme)):
        return None
    node = compose("train", [*head, f"posenc={scheme}", *per_scheme]).posenc
    return OmegaConf.to_container(node, resolve=True)


def _task_grid(tasks, user: Sequence[str], no_memory, add) -> None:
    """The grid of ``ablate.tasks``: each task (``data=<task>``) x scheme x recurrence, and the schemes of
    ``random_positions`` (scheme -> P) once more with ``+model.random_positions=P``."""
    if not tasks.get("names") or not tasks.get("schemes"):
        return
    if bad := [t for t in tasks.names if t not in TASKS]:
        raise ValueError(
            f"ablate: ablate.tasks.names names unknown task(s) {bad}; the tasks: {', '.join(sorted(TASKS))}"
        )
    rand = {k: v for k, v in (tasks.get("random_positions") or {}).items() if v is not None}  # null: none
    for scheme, P in rand.items():
        if scheme not in tasks.schemes or isinstance(P, bool) or not isinstance(P, int) or P < 1:
            raise ValueError(
                f"ablate.tasks.random_positions.{scheme}={P!r}: it takes a scheme of ablate.tasks.schemes and an "
                f"integer P >= 1 (+model.random_positions=P)"
            )
    common = [o for o in train_overrides(user) if not o.lstrip("+~").startswith("data")]
    for task in tasks.names:  # each task defined by its own data: the user's data overrides are the main grid's
        head = [f"experiment={tasks.get('experiment') or 'lengthgen'}", f"data={task}", *common]
        head += list(tasks.get("overrides") or [])
        tcfg = compose("train", head)
        check_corpus_options(tcfg.data.name, tcfg.data.get("corpus") or {})
        for scheme in tasks.schemes:
            for rec in tasks.get("recurrence") or [True, False]:
                if rec or no_memory is None or scheme in no_memory:
                    for P in [None] + ([rand[scheme]] if scheme in rand else []):
                        add(task, scheme, bool(rec), 1.0, head, int(tcfg.model.mem_len), tcfg, P)


def seeds_by_cell(specs: Sequence[RunSpec]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for s in specs:
        out.setdefault(s.cell, []).append(s.seed)
    return out


def run_config(spec: RunSpec, run_dir: Path) -> DictConfig:
    """The run's training config, composed as its `posenc-lab train` command line would compose it."""
    cfg = compose("train", [*spec.overrides, f"run_dir={quote(str(run_dir))}"])
    with open_dict(cfg):
        cfg.pop("ablate", None)
    return cfg


def check_grid(specs: Sequence[RunSpec], runs: Path) -> dict[str, DictConfig]:
    """Every run's config, checked by the one validator before any training: ValueError listing the problems."""
    configs, found = {}, []
    for spec in specs:
        cfg = configs[spec.name] = run_config(spec, runs / spec.name)
        found += [f"{spec.name}: {p}" for p in problems(cfg, "train")]
    if found:
        raise ValueError("ablate: the grid's runs have problems:\n  - " + "\n  - ".join(found))
    return configs


_CORPUS_IDS: dict[str, dict] = {}


def status(spec: RunSpec, cfg: DictConfig, run_dir: Path) -> str:
    """ "reused" (finished with the same identity and steps), "resumed" (a checkpoint to continue, or a
    finished run to extend) or "trained". A run (finished or not) with another identity is a ValueError naming the
    differences (nothing is overwritten unless ablate.retrain): its training would be refused, and so would every
    rerun; a damaged file is named, with its remedy."""
    run = RunDir(run_dir)
    if not run.finished and not run.record_file.is_file():
        return "resumed" if run.newest_checkpoint() is not None else "trained"
    data_key = OmegaConf.to_yaml(cfg.data)
    if data_key not in _CORPUS_IDS:
        _CORPUS_IDS[data_key] = corpus_identity(build_datamodule(cfg.data).corpus)
    try:
        saved = run.identity()
        if run.finished:
            results = run.results()
            run.config()  # the analyses read it: a damaged one is named now, not after the training
    except (CorruptFileError, RunDirError) as e:
        raise ValueError(f"ablate: {e}") from e
    now = run_identity(OmegaConf.to_container(cfg, resolve=True), _CORPUS_IDS[data_key])
    if saved is not None and (diff := differences(saved, now)):
        raise ValueError(
            f"ablate: {run_dir} holds a{' finished' * run.finished} run with other settings ({'; '.join(diff[:6])}). "
            f"Use another ablate.out, or ablate.retrain=true to train it again"
        )
    if not run.finished:
        return "resumed" if run.newest_checkpoint() is not None else "trained"
    return "reused" if int(results.get("steps") or 0) >= int(cfg.trainer.max_steps) else "resumed"


def foreign_files(specs: Sequence[RunSpec], runs: Path) -> str | None:
    """The files of another's in the folders the plan trains in (``RunDir.foreign_files``: a folder of files but no
    run), in one line naming each file and what to do; None if there are none. Training there is refused, and so
    would every rerun be, and ablate.retrain would delete them: they are moved by hand. Names are all it reads."""
    found = [runs / s.name / name for s in specs for name in RunDir(runs / s.name).foreign_files()]
    if not found:
        return None
    shown = ", ".join(map(str, found[:5])) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    return (
        f"ablate: the run folders of the plan hold files that are not a posenc-lab run's: {shown}; move them out of "
        f"{runs} (ablate trains each run in its own folder there), then rerun the same command"
    )

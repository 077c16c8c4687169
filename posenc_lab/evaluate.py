"""Evaluate a checkpoint at any segment length, memory length or "same length" mask.

CLI (Hydra, conf/eval.yaml):

    posenc-lab eval ckpt=runs/X/checkpoints/last.ckpt data.segment_len=256 model.mem_len=512 \\
        model.same_length=true dump_losses=true

writes ``<name>.json`` (the figures and settings) and, with ``dump_losses=true``, ``.npz`` of per-token
arrays [n_streams, T] (see ``evaluate_checkpoint``), atomically, into a folder of the run and checkpoint
(``output_dir``): ``<run dir>/eval/<checkpoint>/``, or with ``out_dir=DIR`` the same in the run's mirror in DIR
by the one run-folder rule (``rundir.run_folder``): ``DIR/runs/<run folder>-<hash of its path>/eval/<checkpoint>/``.
The name carries every setting that changes the figures (``output_name``: ``test_step6_L256_M512_same_Tnone_B16_all``;
a GPU or another precision is named too), so evaluations never overwrite each other, and no option value can name
another folder. out_dir is checked before anything is computed.

The corpus is compared with the one the run was trained on (the SHA-256 in its run.json): a changed
corpus (an edited text file, a rebuilt cache) is refused, naming both hashes, unless ``allow_other_corpus=
true``; the output records both hashes either way. Other corpus settings given on purpose (``+data.corpus.
KEY=...``, ``data.name``) are another corpus by design: recorded, not refused; a path alone (``+data.corpus.path``:
where the corpus lives now) is still compared. A run's corpus path that is not there (a relative one stored by a
posenc-lab before paths were stored absolute, read from another folder) is one line naming ``+data.corpus.path``.

Python:

    from posenc_lab.evaluate import evaluate_checkpoint, load_model, load_config
    r = evaluate_checkpoint("runs/X/checkpoints/last.ckpt", segment_len=256, mem_len=512, same_length=True)
    r["loss"], r["bpb"], r.get("acc_by_distance")      # the corpus's figure: bpb, bpc or ppl (metrics.FIGURES)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import numpy as np
from lightning.fabric.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig, OmegaConf

from . import config_dir, flush_denormals, keep_freed_memory
from .build import build_datamodule
from .checkpoints import CheckpointError, read_checkpoint
from .checks import check, compile_problem
from .compose import grammar_problem, override_problem
from .data import CORPORA, path_options
from .errors import ConfigError, OverrideError, PosencLabError, reported
from .footprint import Shape, fit_problem
from .io import inside, path_problem, safe_name, save_npz, write_json
from .lit import load_lit
from .memory_line import eval_advice
from .metrics import FIGURES, TokenDump
from .model import MemoryTransformer, ModelConfig
from .positional import build_scheme
from .rundir import RunDir, corpus_identity, run_folder

CONF_DIR = config_dir()

log = logging.getLogger("posenc_lab.evaluate")


class OtherCorpusError(PosencLabError, ValueError):
    """The corpus evaluated is not the one the run was trained on; the message names both hashes."""


def load_model(ckpt_path: str | os.PathLike) -> MemoryTransformer:
    """The trained MemoryTransformer of a checkpoint, on the CPU, in eval mode.

    Its ``cfg`` is the training ModelConfig; pass ``mem_len`` / ``same_length`` to its forward pass to
    evaluate with another memory. Raises CheckpointError (naming the file) for a bad checkpoint.
    """
    return load_lit(ckpt_path).model


def load_config(ckpt_path: str | os.PathLike) -> DictConfig:
    """The full resolved training config stored in a checkpoint (posenc, model, data, optim, ...)."""
    config = read_checkpoint(ckpt_path)["hyper_parameters"].get("config")
    if config is None:
        raise CheckpointError(f"checkpoint {ckpt_path} holds no training config")
    return OmegaConf.create(config)


def evaluate_checkpoint(
    ckpt_path: str | os.PathLike,
    segment_len: int | None = None,
    mem_len: int | None = None,
    same_length: bool | None = None,
    split: str = "test",
    *,
    same_length_keys: str | None = None,
    scheme_options: dict[str, Any] | None = None,
    batch_size: int | None = None,
    episode_len: int | None = None,
    data_overrides: dict[str, Any] | None = None,
    max_batches: int | None = None,
    allow_other_corpus: bool = False,
    return_token_losses: bool = False,
    accelerator: str = "cpu",
    precision: str = "32-true",
    progress_bar: bool = False,
    compile: bool = False,
) -> dict[str, Any]:
    """Evaluate a checkpoint on one split; ``None`` keeps what the model was trained with.

    segment_len: L' (data.segment_len); mem_len: M' (memory kept per layer); same_length: every
    query sees the same number of keys; split: "val" | "test"; same_length_keys: "mem_len+1" | "mem_len"
    (the published window); scheme_options: positional-scheme options to change (e.g. {"clamp_len": 400},
    options that change no parameter); batch_size: parallel streams;
    episode_len: memory/offset reset period (longer than in training: horizon extrapolation);
    data_overrides: any other data config keys (e.g. {"root": ..., "corpus": {"path": ...}});
    max_batches: only the first N segments of every stream; allow_other_corpus: evaluate even if the corpus is
    not the one recorded in the run's run.json (OtherCorpusError otherwise); compile: torch.compile the model
    (the memory is static: one graph per segment length).

    Returns a dict: checkpoint, split, scheme, segment_len, mem_len, same_length, batch_size,
    episode_len, precision and device (as Lightning ran them: "32-true", "cpu" | "cuda"), train_steps,
    train_segment_len, train_mem_len, corpus_sha256, run_corpus_sha256 (None without a run.json), other_corpus,
    loss (nats per scored token), the corpus's figure (bpb, bpc or ppl), tokens, wall_time_s, and for recall acc,
    answers, acc_by_distance {"lo-hi": acc}.
    With return_token_losses, also "token_losses": {name: ndarray} with token_loss, targets,
    loss_mask, distance, correct (argmax == target), position (since episode start), all
    [n_streams, T] in stream order, and stream_start [n_streams] (index of each stream's first
    token in the split).
    """
    check(OmegaConf.create({"split": split, "max_batches": max_batches}), "eval")  # the rules of conf/eval.yaml
    dump = TokenDump() if return_token_losses else None
    trainer = _trainer(accelerator, precision, max_batches, dump, progress_bar)  # a device it lacks: before any work
    ckpt = read_checkpoint(ckpt_path)
    model_hp = ckpt["hyper_parameters"]["model"]
    if same_length_keys is not None:
        model_hp["same_length_keys"] = same_length_keys
    if scheme_options:  # checked here, so that a wrong option is named as such, not as a checkpoint misfit
        model_hp["posenc_kwargs"] = {**model_hp.get("posenc_kwargs", {}), **scheme_options}
        cfg = ModelConfig(**model_hp)
        build_scheme(cfg.posenc, cfg.dims, **cfg.posenc_kwargs)
    lengths = {"segment_len": segment_len, "mem_len": mem_len, "batch_size": batch_size}
    if problem := _size_problem(model_hp, ckpt["hyper_parameters"].get("config"), lengths, trainer):
        raise ConfigError(problem)  # before the model is built or the data loaded
    lit = load_lit(ckpt_path, ckpt)
    config = OmegaConf.create(lit.hparams.config or {})
    if "data" not in config:
        raise CheckpointError(f"checkpoint {ckpt_path} holds no data config")

    overrides = dict(data_overrides or {})
    for key, value in (("segment_len", segment_len), ("episode_len", episode_len)):
        if value is not None:
            overrides[key] = value
    if batch_size is not None:
        overrides["batch_size"] = overrides["eval_batch_size"] = batch_size
    data_cfg = OmegaConf.merge(config.data, overrides)
    _check_corpus_paths(ckpt_path, config.data, overrides)
    datamodule = build_datamodule(data_cfg)
    moved = set((overrides.get("corpus") or {}).keys()) <= set(
        path_options(data_cfg.name) if data_cfg.name in CORPORA else ()
    )  # where, not what
    on_purpose = "name" in overrides or ("corpus" in overrides and not moved) or allow_other_corpus
    corpus = _check_corpus(ckpt_path, datamodule, on_purpose=on_purpose)

    model = lit.model
    if compile and (problem := compile_problem(model.cfg.posenc, model.scheme)):
        raise ConfigError(problem)
    if compile:  # in place: the state_dict keys stay those of the eager model
        if slower := model.scheme.compile_slower:
            log.warning(f"compile=true with posenc={model.cfg.posenc}: {slower}")
        model.compile()
    lit.evaluate_at(None if mem_len is None else int(mem_len), None if same_length is None else bool(same_length))
    mem_len = lit.eval_lengths.get("mem_len", model.cfg.mem_len)
    same_length = lit.eval_lengths.get("same_length", model.cfg.same_length)
    try:
        lit.check_data(datamodule, (split,))
    except ValueError as e:
        raise ValueError(f"cannot evaluate {ckpt_path} this way ({split} split): {e}") from e

    start = time.perf_counter()
    run = trainer.validate if split == "val" else trainer.test
    run(lit, datamodule=datamodule, verbose=False)
    wall = time.perf_counter() - start

    train_data = config.data
    result: dict[str, Any] = {
        "checkpoint": str(ckpt_path),
        "split": split,
        "scheme": model.cfg.posenc,
        "segment_len": int(data_cfg.segment_len),
        "mem_len": mem_len,
        "same_length": same_length,
        "same_length_keys": model.cfg.same_length_keys,
        "scheme_options": dict(scheme_options or {}),
        "batch_size": int(data_cfg.eval_batch_size or data_cfg.batch_size),
        "episode_len": data_cfg.episode_len,
        "max_batches": max_batches,
        "precision": str(trainer.precision),  # as Lightning runs it ("32" is 32-true, 16-mixed on a CPU bf16-mixed)
        "device": trainer.strategy.root_device.type,
        "data_overrides": {
            k: v
            for k, v in (data_overrides or {}).items()
            if k not in ("segment_len", "episode_len", "batch_size", "root")
        },
        "train_steps": int(ckpt.get("global_step", 0)),
        "train_segment_len": int(train_data.segment_len),
        "train_mem_len": model.cfg.mem_len,
        "train_episode_len": train_data.episode_len,
        **corpus,
        **lit.eval_results[split],
        "wall_time_s": wall,
    }
    if return_token_losses:
        arrays = dict(dump.arrays.get(split, {}))
        stream = datamodule.streams[split]
        arrays["stream_start"] = np.arange(stream.batch_size, dtype=np.int64) * stream.stream_len
        result["token_losses"] = arrays
    return result


def _trainer(accelerator: str, precision: Any, max_batches: int | None, dump: TokenDump | None, progress_bar: bool):
    """The evaluation's Trainer; ConfigError naming the key if Lightning refuses its accelerator or precision."""
    try:
        return L.Trainer(
            accelerator=accelerator,
            devices=1,
            precision=precision,
            logger=False,
            callbacks=[dump] if dump else None,
            enable_checkpointing=False,
            enable_model_summary=False,
            enable_progress_bar=progress_bar,
            use_distributed_sampler=False,
            limit_val_batches=1.0 if max_batches is None else max_batches,
            limit_test_batches=1.0 if max_batches is None else max_batches,
        )
    except (ValueError, MisconfigurationException) as e:
        if "recision" in str(e):
            raise ConfigError(f"precision={precision!r} is not a precision Lightning takes: {e}") from None
        raise ConfigError(
            f"accelerator={accelerator!r} cannot run on this machine: {e} Use accelerator=cpu (or auto: the best here)"
        ) from None


def _size_problem(model_hp: dict, config: dict | None, given: dict[str, Any], trainer: L.Trainer) -> str | None:
    """One line if evaluating the checkpoint's model (``model_hp``, its training ``config``) at the ``given`` lengths
    (segment_len, mem_len, batch_size; None: as trained) cannot fit on the trainer's device (``footprint``)."""
    data = (config or {}).get("data") or {}
    try:
        cfg = ModelConfig(**model_hp)
    except (TypeError, ValueError):
        return None  # load_lit names a checkpoint that does not fit ModelConfig
    trained = {
        "segment_len": data.get("segment_len"),
        "mem_len": cfg.mem_len,
        "batch_size": data.get("eval_batch_size") or data.get("batch_size"),
    }
    sizes = {k: trained[k] if given[k] is None else given[k] for k in trained}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in sizes.values()):
        return None  # named by the data module or the model
    options = {
        "segment_len": ("data.segment_len", sizes["segment_len"]),
        "mem_len": ("model.mem_len", sizes["mem_len"]),
        "batch": ("data.batch_size", sizes["batch_size"]),
    }
    shape = Shape(sizes["batch_size"], sizes["segment_len"], sizes["mem_len"])
    device = str(trainer.strategy.root_device)
    return fit_problem(cfg, None, [shape], device, options, what="this evaluation")


def _check_corpus_paths(ckpt_path: str | os.PathLike, trained: DictConfig, overrides: dict[str, Any]) -> None:
    """ConfigError naming ``+data.corpus.KEY=PATH`` when a local path the run's corpus was read from (textdir's,
    textfile's) is not there now and no override gives it: a relative one (stored as typed before paths were
    stored absolute) names another folder from another working directory."""
    name = trained.get("name")
    if name not in CORPORA or "name" in overrides:
        return
    given = overrides.get("corpus") or {}
    for key in path_options(name):
        typed = (trained.get("corpus") or {}).get(key)
        if key in given or not isinstance(typed, str) or os.path.exists(os.path.expanduser(typed)):
            continue
        run = RunDir.of_checkpoint(ckpt_path).path
        relative = (
            ""
            if os.path.isabs(os.path.expanduser(typed))
            else (
                f", relative to the folder it was trained from, which from {os.getcwd()} is "
                f"{os.path.abspath(os.path.expanduser(typed))}"
            )
        )
        raise ConfigError(
            f"the corpus of run {run} is not there: data.corpus.{key}={typed!r}{relative}; pass "
            f"+data.corpus.{key}=PATH where it is now (its hash is still compared with the run's)"
        )


def _check_corpus(ckpt_path: str | os.PathLike, datamodule, on_purpose: bool) -> dict[str, Any]:
    """{corpus_sha256, run_corpus_sha256, other_corpus}; OtherCorpusError if the corpus is not the run's and
    that is not on purpose (``on_purpose``: other corpus settings given, or allow_other_corpus)."""
    run = RunDir.of_checkpoint(ckpt_path)
    recorded = ((run.identity() or {}).get("corpus") or {}).get("sha256")
    now = corpus_identity(datamodule.corpus)["sha256"]
    if recorded is None:
        log.warning("%s has no run.json: the corpus cannot be compared with the one it was trained on", run.path)
    elif recorded != now and not on_purpose:
        raise OtherCorpusError(
            f"data.name={datamodule.name} is not the corpus run {run.path} was trained on: its run.json records "
            f"sha256 {recorded}, the corpus now gives {now} (a changed text file or cache?). To evaluate on it "
            f"anyway: allow_other_corpus=true (the output records it)"
        )
    return {"corpus_sha256": now, "run_corpus_sha256": recorded, "other_corpus": recorded not in (None, now)}


def output_name(result: dict[str, Any]) -> str:
    """A name that differs whenever the figures of one checkpoint may: split, its step, segment (L), memory (M),
    window, episode (T), streams (B), segments per stream (``all`` or ``first<N>``), scheme options, precision
    (unless 32-true), the device (unless the CPU), a hash of any other data setting and ``other-corpus`` when the
    corpus is not the run's. ``test_step6_L32_M32_same_Tnone_B4_all``; on a GPU in bf16
    ``test_step6_L32_M32_same_Tnone_B4_all_bf16-mixed_cuda``. The CPU in fp32 adds nothing, so that the names of
    evaluations from before the device was named stay valid (they ran there unless accelerator was set: eval's
    default ``auto`` took a GPU where there was one). Option keys and values are made safe for a file name
    (``io.safe_name``): none can name another folder."""
    name = f"{result['split']}_step{result['train_steps']}_L{result['segment_len']}_M{result['mem_len']}"
    if result["same_length"]:
        name += "_same" + ("-published" if result.get("same_length_keys") == "mem_len" else "")
    episode, max_batches = result.get("episode_len"), result.get("max_batches")
    name += f"_T{'none' if episode is None else episode}_B{result['batch_size']}"
    name += "_all" if max_batches is None else f"_first{max_batches}"
    name += "".join(f"_{safe_name(k)}{safe_name(v)}" for k, v in sorted(result.get("scheme_options", {}).items()))
    if result.get("precision", "32-true") != "32-true":
        name += f"_{safe_name(result['precision'])}"
    if result.get("device", "cpu") != "cpu":
        name += f"_{safe_name(result['device'])}"
    if result.get("data_overrides"):
        canonical = json.dumps(result["data_overrides"], sort_keys=True, default=str).encode()
        name += "_data-" + hashlib.sha1(canonical).hexdigest()[:8]  # the settings are in the .json itself
    if result.get("other_corpus"):
        name += "_other-corpus-" + str(result["corpus_sha256"])[:8]
    if len(name.encode()) > 200:  # a file system takes 255 bytes, with .json / .npz
        name = f"{name[:180]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return name


def output_dir(ckpt_path: str | os.PathLike, out_dir: str | os.PathLike | None) -> Path:
    """The folder of the outputs of evaluating ``ckpt_path``: ``<run folder>/eval/<checkpoint>`` (``RunDir.eval_dir``),
    the run folder being the run's own or, with ``out_dir``, its mirror there by the one run-folder rule:
    ``rundir.run_folder(out_dir, <run folder's name>-<hash of its absolute path>)`` (two runs may share a folder
    name), that is ``<out_dir>/runs/<run>-<hash>/eval/<checkpoint>``. <checkpoint>: the file name without .ckpt
    (last, good, good.prev, step0000500)."""
    run, name = RunDir.of_checkpoint(ckpt_path), Path(ckpt_path).name.removesuffix(".ckpt")
    if out_dir is not None:
        tag = hashlib.sha1(str(run.path.resolve()).encode()).hexdigest()[:8]
        run = RunDir(run_folder(out_dir, f"{run.path.resolve().name}-{tag}"))
    return run.eval_dir / name


def main() -> None:
    """``posenc-lab eval``: the command line's overrides are checked before Hydra composes them (its messages name no
    valid key), then the composed config before the compute."""
    with reported("eval"):
        if problem := grammar_problem("eval", sys.argv[1:], "eval"):  # Hydra's own: a 5-line parser error
            raise OverrideError(problem)
        if problem := override_problem("eval", sys.argv[1:], "eval"):
            raise ConfigError(problem)
    _hydra_main()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="eval")
def _hydra_main(cfg: DictConfig) -> None:
    with reported("eval", lambda: eval_advice(cfg)):
        evaluate_main(cfg)


def evaluate_main(cfg: DictConfig) -> None:
    """``posenc-lab eval``: evaluate, then write <out_dir>/<output_name>.json (and .npz), atomically."""
    check(cfg, "eval")
    ckpt = Path(cfg.ckpt)
    out_dir = output_dir(ckpt, cfg.out_dir)
    problem = path_problem(out_dir, "out_dir")
    if problem:  # before the compute, not after it
        raise ConfigError(problem)
    data = {k: v for k, v in OmegaConf.to_container(cfg.data, resolve=True).items() if v is not None}
    result = evaluate_checkpoint(
        ckpt,
        segment_len=data.pop("segment_len", None),
        mem_len=cfg.model.mem_len,
        same_length=cfg.model.same_length,
        split=cfg.split,
        same_length_keys=cfg.model.same_length_keys,
        scheme_options={k: v for k, v in OmegaConf.to_container(cfg.posenc, resolve=True).items() if v is not None},
        batch_size=data.pop("batch_size", None),
        episode_len=data.pop("episode_len", None),
        data_overrides=data,
        max_batches=cfg.max_batches,
        allow_other_corpus=bool(cfg.allow_other_corpus),
        return_token_losses=bool(cfg.dump_losses),
        accelerator=cfg.accelerator,
        precision=cfg.precision,
        progress_bar=bool(cfg.progress_bar),
        compile=bool(cfg.get("compile", False)),
    )
    name = output_name(result)
    json_file, npz_file = inside(out_dir, f"{name}.json"), inside(out_dir, f"{name}.npz")
    arrays = result.pop("token_losses", None)
    if arrays is not None:  # the .npz first: a .json present means its arrays are complete
        save_npz(npz_file, **arrays)
        result["token_losses_file"] = str(npz_file)
    write_json(json_file, result)
    figures = {k: result[k] for k in ("loss", *FIGURES.values(), "acc") if k in result}  # the corpus's own
    print(f"{json_file}: {json.dumps(figures)}")


if __name__ == "__main__":
    keep_freed_memory()  # also when run as python -m, and in DDP ranks
    flush_denormals()
    main()

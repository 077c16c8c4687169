"""The long tail: every bad input is one line naming the key or the file and the fix, before
anything is written, through the real command entry points (in this process, as the console runs them); a stop
signal during a command's start-up is one line and its exit status."""

from __future__ import annotations

import contextlib
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

from posenc_lab import bench, evaluate
from posenc_lab import train as train_module
from posenc_lab.compose import compose
from posenc_lab.data import load_corpus
from tests.data.test_textdir import notes
from tests.helpers_train import CORPUS, cli, no_stale_log_handlers, run_module, tiny  # noqa: F401 - an autouse fixture


def _file(tmp, name, content: bytes) -> Path:
    (tmp / name).write_bytes(content)
    return tmp / name


def _folder(tmp, name) -> Path:
    (tmp / name).mkdir()
    return tmp / name


def _link(tmp, name, target) -> Path:
    os.symlink(target, tmp / name)
    return tmp / name


def _without(args: list[str], key: str) -> list[str]:
    return [a for a in args if not a.startswith(f"{key}=")]


_MOUNTS: list[Path] = []


@pytest.fixture(autouse=True)
def _unmount():
    """Unmounts what a case mounted (``_tmpfs``)."""
    yield
    while _MOUNTS:
        subprocess.run(["umount", "-l", str(_MOUNTS.pop())], check=False)


def _tmpfs(folder: Path, options: str) -> Path:
    """A tmpfs mounted at ``folder`` until the test ends (root only): ``size=64k`` is a disk that fills, ``ro`` a
    file system that refuses every writer, root included."""
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    _MOUNTS.append(folder)
    return folder


def _read_only(folder: Path) -> Path:
    """A folder this process cannot write in: mode 0555 refuses a user; root passes every mode, so for root a
    read-only tmpfs (EROFS), which refuses root as it would any process."""
    if os.geteuid() == 0:
        return _tmpfs(folder, "ro,size=64k")
    folder.mkdir()
    folder.chmod(0o555)
    return folder


def _tampered_cache(tmp: Path) -> Path:
    """A corpus cache (the tiny runs' recall corpus) whose train.npy was overwritten with as many other tokens:
    a valid .npy file of the length the manifest says."""
    root = tmp / "cache"
    options = {o.split("=")[0].split(".")[-1]: int(o.split("=")[1]) for o in CORPUS["recall"]}
    corpus = load_corpus("recall", root=root, **options)
    (train,) = root.rglob("train.npy")
    np.save(train, np.ascontiguousarray(corpus.train[::-1]))
    return root


def _one_book(tmp) -> Path:
    """A textdir of one file: no family to hold out (81 MB of it once took 4 minutes and 6.4 GB to refuse)."""
    folder = _folder(tmp, "book")
    (folder / "book.txt").write_text("one long book\n" * 500)
    return folder


def _lost_link(tmp) -> Path:
    """A textdir with a link to nothing among its files."""
    folder = notes(tmp / "notes")
    os.symlink(tmp / "gone.txt", folder / "topic00" / "lost.txt")
    return folder


def _no_cache_root(argv: list[str]) -> list[str]:
    return [a for a in argv if not a.startswith("data.root=")]


def _folder_in_run(tmp, name, kind) -> Path:
    """A run directory holding only ``name``, a file (kind "file") or a folder ("dir")."""
    run = tmp / "run"
    run.mkdir()
    (run / name).mkdir() if kind == "dir" else (run / name).write_bytes(b"mine")
    return run


def _reshaped(tmp, finished) -> Path:
    """The finished run's checkpoint with its token embedding one row short (hyper-parameters unchanged)."""
    ckpt = torch.load(finished / "checkpoints" / "last.ckpt", weights_only=True)
    key = next(k for k, v in ckpt["state_dict"].items() if v.dim() == 2)
    ckpt["state_dict"][key] = ckpt["state_dict"][key][:-1].clone()
    torch.save(ckpt, tmp / "shape.ckpt")
    return tmp / "shape.ckpt"


def _legacy(tmp) -> Path:
    """A legacy (non-zip) torch.save file that references a class: fractions.Fraction."""
    import fractions

    torch.save(
        {"state_dict": {}, "x": fractions.Fraction(1, 3)}, tmp / "legacy.ckpt", _use_new_zipfile_serialization=False
    )
    return tmp / "legacy.ckpt"


LEGACY_REFUSED = (
    r"^checkpoint \S+/legacy\.ckpt is refused: it holds a reference to the global fractions\.Fraction, .*Nothing"
)
NO_GPU = pytest.mark.skipif(
    torch.cuda.is_available(), reason="needs a machine without a GPU (accelerator=gpu runs here)"
)

# fixed, so that a run cannot draw bytes that happen to begin like a pickle of another protocol (torch then warns)
RANDOM_BYTES = random.Random(0).randbytes(5000)

# (id, command, arguments from (tmp_path, cache, finished run) -- or (arguments, environment) --, expected message
# after "error: ")
CASES = [
    ("unknown model option", "train", lambda t, c, f: tiny(t / "run", c, "+model.foo=1"),
     r"model\.foo is not a model option; the options are: "),
    ("negative seed", "train", lambda t, c, f: tiny(t / "run", c, "seed=-5"),
     r"seed must be an integer >= 0 and <= 4294967295 \(numpy and Lightning take 32-bit seeds\), got -5$"),
    ("seed past 32 bits", "train", lambda t, c, f: tiny(t / "run", c, "seed=99999999999"),
     r"seed must be an integer >= 0 and <= 4294967295 .*got 99999999999$"),
    ("episode shorter than a segment", "train", lambda t, c, f: tiny(t / "run", c, "data.episode_len=8"),
     r"data\.episode_len=8 is shorter than data\.segment_len=16: .* set data\.episode_len >= 16 or null$"),
    ("rope base below 1", "train", lambda t, c, f: tiny(t / "run", c, "posenc=rope", "posenc.base=-1"),
     r"posenc: rope: posenc\.base must be a number > 1 \(10000 in Su et al\. 2021\), got -1"),
    ("run_dir is a file", "train", lambda t, c, f: tiny(_file(t, "run", b"mine"), c),
     r"run_dir=\S+/run: \S+/run is a file, not a folder; use another run_dir$"),
    ("run_dir is a dangling link", "train", lambda t, c, f: tiny(_link(t, "run", t / "gone"), c),
     r"run_dir=\S+/run: \S+/run is a symbolic link to \S+/gone, which does not exist; create it or use another"),
    ("run_dir is a loop of links", "train", lambda t, c, f: tiny(_link(t, "run", t / "run"), c),
     r"run_dir=\S+/run: \S+/run is a loop of symbolic links; remove it or use another run_dir$"),
    ("hydra.run.dir is a file", "train",
     lambda t, c, f: [*tiny(t / "run", c)[1:], f"hydra.run.dir={_file(t, 'run', b'mine')}"],
     r"hydra\.run\.dir=\S+/run: \S+/run is a file, not a folder; use another hydra\.run\.dir$"),
    ("a 300-character name in run_dir", "train", lambda t, c, f: tiny(t / ("x" * 300) / "run", c),
     r"run_dir: the name x{24}\.\.\. in it is 300 bytes long, a file system takes 255; use a shorter one$"),
    ("an empty text file", "train",
     lambda t, c, f: tiny(t / "run", c, f"data.corpus.path={_file(t, 'empty.txt', b'')}", data="textfile"),
     r"textfile corpus: \S+/empty\.txt \(data\.corpus\.path\) is too small: 0 bytes cannot be split .*larger file$"),
    ("a 10-byte text file", "train",
     lambda t, c, f: tiny(t / "run", c, f"data.corpus.path={_file(t, 'ten.txt', b'0123456789')}", data="textfile"),
     r"textfile corpus: \S+/ten\.txt \(data\.corpus\.path\) is too small: 10 bytes cannot be split .*it takes 40\)"),
    ("no folder for textdir", "train",
     lambda t, c, f: tiny(t / "run", c, f"data.corpus.path={t / 'nowhere'}", data="textdir"),
     r"^textdir corpus: no folder at \S+/nowhere \(data\.corpus\.path\)$"),
    ("an empty folder for textdir", "train",
     lambda t, c, f: tiny(t / "run", c, f"data.corpus.path={_folder(t, 'empty')}", data="textdir"),
     r"^textdir corpus: no file under \S+/empty \(data\.corpus\.path\) matches data\.corpus\.glob='\*\*/\*' "),
    # a textdir the split by family cannot hold out is refused before any file is read
    ("a textdir of one file", "train",
     lambda t, c, f: tiny(t / "run", c, f"data.corpus.path={_one_book(t)}", data="textdir"),
     r"^textdir corpus: \S+/book \(data\.corpus\.path\): the split by family holds out whole families .*needs 2 or "
     r"more of at most 10%, one of them at most 5%; it has 1 file: 0 top-level folders and 1 file at the top, the "
     r"smallest 100\.0% of the bytes; put its files in more top-level folders \(20 or more .*data=textfile$"),
    ("a textdir of 12 top-level folders", "train",
     lambda t, c, f: tiny(t / "run", c, f"data.corpus.path={notes(t / 'notes', folders=12)}", data="textdir"),
     r"^textdir corpus: \S+/notes \(data\.corpus\.path\): the split by family .*; it has 24 files: 12 top-level "
     r"folders and 0 files at the top, the smallest [78]\.\d% of the bytes; put its files in more top-level folders"),
    ("a textdir with a link to nothing", "train",
     lambda t, c, f: tiny(t / "run", c, f"data.corpus.path={_lost_link(t)}", data="textdir"),
     r"^textdir corpus: \S+/topic00/lost\.txt \(a symbolic link to \S+/gone\.txt\) cannot be read: No such file or "
     r"directory; remove it, fetch what it names, or leave it out with data\.corpus\.glob$"),
    ("a max_bytes that is no number", "train",
     lambda t, c, f: tiny(t / "run", c, f"data.corpus.path={t}", "data.corpus.max_bytes=abc", data="textdir"),
     r"^data\.corpus\.max_bytes must be an integer or null, got 'abc'$"),
    ("a max_bytes that is a list", "train",
     lambda t, c, f: tiny(t / "run", c, f"data.corpus.path={t}", "data.corpus.max_bytes=[1]", data="textdir"),
     r"^data\.corpus\.max_bytes must be an integer or null, got \[1\]$"),
    ("the base of the data options", "train", lambda t, c, f: tiny(t / "run", c, data="default"),
     r"^data=default is not an option of data; the options are: .*\benwik8, .*\btextdir, "),
    ("random bytes as a checkpoint", "train",
     lambda t, c, f: tiny(t / "run", c, f"resume={_file(t, 'x.ckpt', RANDOM_BYTES)}"),
     r"checkpoint \S+/x\.ckpt cannot be read \(corrupt or not a checkpoint\)"),
    ("eval: random bytes as a checkpoint", "eval", lambda t, c, f: [f"ckpt={_file(t, 'x.ckpt', RANDOM_BYTES)}"],
     r"checkpoint \S+/x\.ckpt cannot be read \(corrupt or not a checkpoint\)"),
    ("eval: out_dir is a file", "eval",
     lambda t, c, f: [f"ckpt={f / 'checkpoints' / 'last.ckpt'}", f"out_dir={_file(t, 'out', b'mine')}"],
     r"out_dir=\S+/out/runs/run-[0-9a-f]{8}/eval/last: \S+/out is a file, not a folder; use another out_dir$"),
    # command lines Hydra would refuse with a message that names no valid key (or suggests +key=): refused first
    ("a misspelled model key", "train", lambda t, c, f: tiny(t / "run", c, "model.mem_lenn=32"),
     r"^model\.mem_lenn is not a key of model; the keys are: .*\bmem_len, "),
    ("a misspelled optim key", "train", lambda t, c, f: tiny(t / "run", c, "optim.lrr=0.1"),
     r"^optim\.lrr is not a key of optim; the keys are: .*\blr, "),
    ("a misspelled trainer key", "train", lambda t, c, f: tiny(t / "run", c, "trainer.max_stepz=5"),
     r"^trainer\.max_stepz is not a key of trainer; the keys are: .*\bmax_steps\b"),
    ("a scheme option of the wrong type", "train", lambda t, c, f: tiny(t / "run", c, "posenc.share_uv=maybe"),
     r"^posenc: xl: posenc\.share_uv must be true or false, got 'maybe'$"),
    ("another scheme's option", "train", lambda t, c, f: tiny(t / "run", c, "posenc=rope", "posenc.K=4"),
     r"^posenc\.K is not a key of posenc; the keys are: .*\bbase\b"),
    ("random positions for a scheme that reads none", "train",
     lambda t, c, f: tiny(t / "run", c, "posenc=nope", "+model.random_positions=256"),
     r"^model\.random_positions=256 does not apply to posenc=nope: .* \(set model\.random_positions=null\)$"),
    ("random positions for a hybrid whose layers read none", "train",
     lambda t, c, f: tiny(t / "run", c, "posenc=hybrid", "posenc.layers=[nope,fox]", "+model.random_positions=256"),
     r"^model\.random_positions=256 does not apply to posenc=hybrid: none of its layers reads a position \(it builds "
     r"nope, fox layers, .*\(set model\.random_positions=null\)$"),
    ("scalable softmax for a scheme whose attention is no softmax", "train",
     lambda t, c, f: tiny(t / "run", c, "posenc=stickbreaking", "model.softmax_scale=ssmax"),
     r"^model\.softmax_scale=ssmax does not apply to posenc=stickbreaking: .* \(set model\.softmax_scale=null\)$"),
    ("longrope without its factors", "train",
     lambda t, c, f: tiny(t / "run", c, "posenc=rope", "posenc.scaling=longrope"),
     r"^posenc: rope: scaling=longrope needs posenc\.short_factor, a list of d_h/2 = 8 numbers > 0 .*got None$"),
    ("an unknown scheme", "train", lambda t, c, f: tiny(t / "run", c, "posenc=xll"),
     r"^posenc=xll is not an option of posenc; the options are: alibi, .*\bxl, xpos$"),
    ("a group train does not take", "train", lambda t, c, f: tiny(t / "run", c, "preset=txl_wt103_base"),
     r"^preset=txl_wt103_base: `posenc-lab train` takes no preset group \(its groups: data, .*trainer\)$"),
    ("eval: no checkpoint", "eval", lambda t, c, f: [], r"^ckpt is required: posenc-lab eval ckpt=PATH"),
    ("eval: an empty checkpoint path", "eval", lambda t, c, f: ["ckpt="], r"^ckpt is required"),
    ("eval: a misspelled key", "eval", lambda t, c, f: [f"ckpt={f / 'checkpoints' / 'last.ckpt'}", "model.mem_lenn=3"],
     r"^model\.mem_lenn is not a key of model; the keys are: mem_len, same_length, same_length_keys$"),
    ("eval: a model group", "eval", lambda t, c, f: [f"ckpt={f / 'checkpoints' / 'last.ckpt'}", "model=tiny"],
     r"^model=tiny: `posenc-lab eval` takes no model group .*; set its keys as model\.KEY=VALUE$"),
    ("eval: another scheme", "eval", lambda t, c, f: [f"ckpt={f / 'checkpoints' / 'last.ckpt'}", "+posenc=rope"],
     r"^posenc\.name='rope' cannot be set at evaluation: .*\+posenc\.scaling=yarn"),
    # once found after compute, as tracebacks, or accepted silently
    ("an unknown strategy", "train", lambda t, c, f: tiny(t / "run", c, "trainer.strategy=foo"),
     r"^trainer\.strategy='foo' is not a Lightning strategy; valid: auto, ddp, .*\bfsdp\b.*, or a Lightning Strategy "
     r"by _target_$"),
    ("an unknown accelerator", "train", lambda t, c, f: tiny(t / "run", c, "trainer.accelerator=foo"),
     r"^trainer\.accelerator='foo' is not a Lightning accelerator; valid: auto, gpu, cpu, cuda, .*, or a Lightning "
     r"Accelerator by _target_$"),
    ("no devices", "train", lambda t, c, f: tiny(t / "run", c, "trainer.devices=0"),
     r"^trainer\.devices must be an integer >= 1, -1, a list or 'auto', got 0$"),
    ("no nodes", "train", lambda t, c, f: tiny(t / "run", c, "trainer.num_nodes=0"),
     r"^trainer\.num_nodes must be an integer >= 1, got 0$"),
    ("a memory of 1e11", "train", lambda t, c, f: tiny(t / "run", c, "model.mem_len=1e11"),
     r"^model\.mem_len must be an integer >= 0, got 100000000000\.0$"),
    ("a run_dir with a space and parentheses", "train", lambda t, c, f: tiny(t / "my run (1)", c),
     r"""^run_dir=\S+/my run \(1\): Hydra's override grammar cannot read the character\(s\) '\(', '\)' in this value """
     r"""unquoted; quote it for Hydra, inside """
     r"""the shell's quotes: "run_dir='\S+/my run \(1\)'"$"""),
    # the quoting hint sweep-check shares (compose.unquoted); a long value is echoed cut (errors.shown)
    ("a run_dir with non-ASCII letters", "train", lambda t, c, f: tiny(t / "grüße", c),
     r"""^run_dir=\S+/grüße: Hydra's override grammar cannot read the character\(s\) 'ü', 'ß' in this value """
     r"""unquoted; quote it for Hydra, inside the shell's quotes: "run_dir='\S+/grüße'"$"""),
    ("a 200,000-character value", "train", lambda t, c, f: tiny(t / "run", c, "optim.lr=" + "a" * 200_000),
     r"^optim\.lr must be a number > 0, got 'a{200}\.\.\.' \(200000 chars\)$"),
    ("a 200,000-character scheme option", "train",
     lambda t, c, f: tiny(t / "run", c, "posenc=rope", "posenc.base=" + "b" * 200_000),
     r"^posenc: rope: posenc\.base must be a number, got 'b{399}\.\.\. \(200002 chars\)$"),
    ("an unknown +key of optim", "train", lambda t, c, f: tiny(t / "run", c, "+optim.lrr=0.1"),
     r"^optim\.lrr is not a key of optim; the keys are: .*\blr, .*; \+KEY adds a key only under model, posenc, data, "
     r"trainer, logger, callbacks, where it is checked$"),
    ("an unknown top-level +key", "train", lambda t, c, f: tiny(t / "run", c, "+foo=1"),
     r"^foo is not a key of `posenc-lab train`; the keys are: .*\bseed, .*; \+KEY adds a key only under model, "),
    ("an unknown logger option", "train", lambda t, c, f: tiny(t / "run", c, "+logger.foo=1"),
     r"^logger\.foo is not an argument of lightning\.pytorch\.loggers\.CSVLogger; its arguments: save_dir, name, "),
    ("a callback without its class", "train", lambda t, c, f: tiny(t / "run", c, "+callbacks.x.a=1"),
     r"^callbacks\.x has no _target_: it is a Callback by its class, e\.g\. callbacks\.x\._target_=MODULE\.CLASS$"),
    ("a callback that is not a callback", "train",
     lambda t, c, f: tiny(t / "run", c, "+callbacks.x._target_=subprocess.Popen",
                          f"+callbacks.x.args=[touch,{t / 'MARKER'}]"),
     r"^callbacks\.x\._target_=subprocess\.Popen is not a lightning\.pytorch\.callbacks\.callback\.Callback$"),
    ("eval: an unknown +key", "eval", lambda t, c, f: [f"ckpt={f / 'checkpoints' / 'last.ckpt'}", "+foo=1"],
     r"^foo is not a key of `posenc-lab eval`; the keys are: .*; \+KEY adds a key only under posenc, data, where it "
     r"is checked$"),
    ("a multirun job that would fail after job 0 trained", "train",
     lambda t, c, f: ["-m", *_without(tiny(t / "run", c), "model.mem_len"), "model.mem_len=16,-1"],
     r"^job 1 \(model\.mem_len=-1\): model\.mem_len must be an integer >= 0, got -1; no job was started$"),
    ("multirun jobs with another scheme's option", "train",
     lambda t, c, f: ["-m", *_without(tiny(t / "run", c), "model.mem_len"), "posenc=shaw,rope", "model.mem_len=8,16",
                      "posenc.K=4"],
     r"^job 2 \(posenc=rope model\.mem_len=8\) \(also job 3\): posenc\.K is not a key of posenc; the keys are: "
     r".*\bbase, .*; no job was started$"),
    # the corpus cache
    ("a cache file changed after it was written", "train", lambda t, c, f: tiny(t / "run", _tampered_cache(t)),
     r"^corpus cache file \S+/recall/[0-9a-f]{12}/train\.npy is not the file posenc-lab wrote there \(blake2b "
     r"[0-9a-f]{16}\.\.\., its manifest says [0-9a-f]{16}\.\.\.\): something changed it\. Delete \S+/recall/"
     r"[0-9a-f]{12} to prepare the corpus again$"),
    ("a full disk while the corpus cache is built", "train",
     lambda t, c, f: tiny(t / "run", _tmpfs(t / "disk", "size=64k")),
     r"^no space left on the file system at \S+/disk \([\d.]+ MiB free\) to write \S+/disk/recall/[0-9a-f]{12}/"
     r"train\.npy: it was not written"),
    ("data.root is a file", "train", lambda t, c, f: tiny(t / "run", _file(t, "root", b"mine")),
     r"^data\.root=\S+/root: cannot write the corpus cache \S+/root/recall/[0-9a-f]{12}: \S+/root is a file, not a "
     r"folder; corpus recall .* set data\.root \(or \$POSENC_LAB_CACHE\) to a folder this process can write$"),
    ("a read-only POSENC_LAB_CACHE", "train",
     lambda t, c, f: (_no_cache_root(tiny(t / "run", c)), {"POSENC_LAB_CACHE": str(_read_only(t / "ro"))}),
     r"^\$POSENC_LAB_CACHE=\S+/ro: cannot write the corpus cache \S+/ro/recall/[0-9a-f]{12}: (\S+/ro is on a "
     r"read-only file system|no permission to write in \S+/ro); .* set data\.root \(or \$POSENC_LAB_CACHE\) to"),
    # corpus options name their data.corpus.* key
    ("no recall training tokens", "train", lambda t, c, f: tiny(t / "run", c, "data.corpus.train_tokens=0"),
     r"^recall corpus: data\.corpus\.train_tokens=0 is too short for one item: it takes >= max_distance \+ "
     r"max_gap \+ 2 = 50 tokens$"),
    ("recall min_distance above max_distance", "train",
     lambda t, c, f: tiny(t / "run", c, "data.corpus.min_distance=50"),
     r"^recall corpus: data\.corpus\.min_distance=50 is above data\.corpus\.max_distance=40: it must be <= "
     r"max_distance$"),
    # once found only after compute or writes, or as a traceback
    ("a checkpoint folder that cannot be created", "train",
     lambda t, c, f: tiny(t / "run", c, "callbacks.checkpoint.dirpath=/proc/nope"),
     r"^callbacks\.checkpoint\.dirpath=/proc/nope: cannot create nope in /proc \(.+\); use another callbacks\."),
    ("a checkpoint file name that leaves its folder", "train",
     lambda t, c, f: tiny(t / "run", c, "callbacks.checkpoint.filename=../../x"),
     r"^callbacks\.checkpoint\.filename='\.\./\.\./x' would save checkpoints outside callbacks\.checkpoint\."),
    ("checkpoints/ is a file", "train", lambda t, c, f: tiny(_folder_in_run(t, "checkpoints", "file"), c),
     r"^run_dir \S+/run: its checkpoints is a file, not a folder .*; move it away or use another run_dir$"),
    (".lock is a folder", "train", lambda t, c, f: tiny(_folder_in_run(t, ".lock", "dir"), c),
     r"^\S+/run/\.lock is a folder, not the run's lock file \(posenc-lab writes it\); remove it and rerun$"),
    ("resume= a checkpoint of another shape", "train", lambda t, c, f: tiny(t / "run", c, f"resume={_reshaped(t, f)}"),
     r"^checkpoint \S+/shape\.ckpt holds weights of another shape than this model's: model\.\S+: checkpoint \[\d+, "
     r"\d+\], now \[\d+, \d+\]$"),
    ("a legacy checkpoint referencing a class", "train", lambda t, c, f: tiny(t / "run", c, f"resume={_legacy(t)}"),
     LEGACY_REFUSED),
    ("eval: a legacy checkpoint referencing a class", "eval", lambda t, c, f: [f"ckpt={_legacy(t)}"],
     LEGACY_REFUSED),
    ("a corpus name with a /", "train", lambda t, c, f: [*tiny(t / "run", c)[1:], "data.name=../../x"],
     r"^data\.name='\.\./\.\./x' is no data name \(run directories are named after it\): use data=NAME$"),
    ("eval: a precision Lightning does not know", "eval",
     lambda t, c, f: [f"ckpt={f / 'checkpoints' / 'last.ckpt'}", "precision=bogus"],
     r"^precision='bogus' is not a precision Lightning takes: Precision 'bogus' is invalid. Allowed .*'32-true'"),
    pytest.param("eval: accelerator=gpu without a GPU", "eval",
                 lambda t, c, f: [f"ckpt={f / 'checkpoints' / 'last.ckpt'}", "accelerator=gpu"],
                 r"^accelerator='gpu' cannot run on this machine: .* Use accelerator=cpu \(or auto: the best here\)$",
                 marks=NO_GPU, id="eval: accelerator=gpu without a GPU"),
]  # fmt: skip


def _tree(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder``: file contents, link targets, folders (what a failed command may not change)."""
    out: dict[str, bytes | str] = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(root) / name
            key = str(p.relative_to(folder))
            out[key] = f"-> {os.readlink(p)}" if p.is_symlink() else p.read_bytes() if p.is_file() else "dir"
    return out


@pytest.mark.parametrize(
    "case, command, args, message", CASES, ids=[c[0] if isinstance(c, tuple) else c.id for c in CASES]
)
def test_every_bad_input_is_one_line_before_anything_is_written(
    tmp_path, cache, finished, monkeypatch, capsys, case, command, args, message
):
    work = tmp_path / "work"
    work.mkdir()
    argv, env = args(work, cache, finished), {}
    if isinstance(argv, tuple):  # (arguments, environment)
        argv, env = argv
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before, finished_before = _tree(work), _tree(finished)
    code, err = cli(train_module.main if command == "train" else evaluate.main, argv, monkeypatch, capsys)
    lines = [line for line in err.splitlines() if line.startswith("posenc-lab ")]
    assert code == 1 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"posenc-lab {command}: error: "), err[-3000:]
    # the hint, but for an override Hydra's grammar cannot read: its line is all (tests/test_override_grammar.py)
    grammar = "Hydra's override grammar cannot read" in lines[0]
    assert err.strip().endswith("(set HYDRA_FULL_ERROR=1 for the full traceback)") != grammar, err[-3000:]
    assert re.search(message, lines[0].split(": error: ", 1)[1]), lines[0]
    if "cannot be read" in message:
        assert "Nothing in it was run" not in lines[0]  # damage is not called code
    assert _tree(work) == before and _tree(finished) == finished_before  # nothing written, nothing changed


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler of its own for ``signum`` (Linux: the SigCgt mask of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads a process's signal handlers from /proc")
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["TERM", "INT"])
def test_a_signal_during_the_sweeps_start_up_is_one_line_and_its_exit_status(tmp_path, signum, code):
    """SIGTERM (or Ctrl-C) while `posenc-lab sweep` checks the file's 20 trials, as soon as it handles them: one
    line, 128 + the signal's number, nothing written (it once gave rc -15 and no line; the checks and Hydra's compose
    took the exception of a first fix for a trial that does not compose)."""
    out = tmp_path / "out"
    sweep = Path(__file__).resolve().parents[1] / "sweeps" / "ablation_recall.yaml"
    cmd = [sys.executable, "-m", "posenc_lab.cli", "sweep", str(sweep), "--out", str(out), "model=tiny"]
    env = {**os.environ, "POSENC_LAB_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "offline"}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # SIGTERM's handler is the command's own (Python has one for SIGINT from its start): set with SIGINT's
        deadline = time.monotonic() + 240
        while proc.poll() is None and not _catches(proc.pid, signal.SIGTERM):
            assert time.monotonic() < deadline, "the command never handled SIGTERM"
            time.sleep(0.1)
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == code, stdout[-2000:] + stderr[-3000:]
    assert stderr.strip() == f"posenc-lab sweep: stopped by {signal.Signals(signum).name} before any trial ran"
    assert not stdout and not out.exists() and not (tmp_path / "runs").exists()


def test_the_quoted_run_dir_that_the_message_gives_is_the_path(tmp_path, monkeypatch, capsys):
    """The form the message tells to type reaches the trainer as the path itself (shell, then Hydra's grammar)."""
    run_dir = tmp_path / "it's my run (1), $HOME"
    code, err = cli(train_module.main, [f"run_dir={run_dir}", "trainer.max_steps=0"], monkeypatch, capsys)
    typed = err.split("inside the shell's quotes: ", 1)[1].splitlines()[0]
    (argument,) = shlex.split(typed)
    assert code == 1 and compose("train", [argument]).run_dir == str(run_dir) and not run_dir.exists()


# ---- posenc-lab ablate: its output folder -----------------------------------------------------------

ABLATE_GRID = ["experiment=tiny", "ablate.schemes=[xl]", "ablate.recurrence=[true]", "ablate.half_loss.schemes=[]",
               "ablate.recall.schemes=[]", "--train-only"]  # fmt: skip


@pytest.mark.parametrize(
    "case, message",
    [
        ("ablate.out is a file", r"^ablate\.out=\S+/out: \S+/out is a file, not a folder; use another ablate\.out$"),
        ("ablate.out is another ablate's",
         r"^ablate\.out \S+/out is being written by another process \(pid \d+ on .*\); wait for it to finish or use "
         r"another ablate\.out$"),
    ],
    ids=["file", "locked"],
)  # fmt: skip
def test_a_bad_ablate_out_is_one_line_before_anything_is_written(tmp_path, capsys, case, message):
    """``ablate.out=FILE``, and a second ``posenc-lab ablate`` into the folder another one writes (its lock held
    here, as the first process holds it): one line, nothing trained or written."""
    from posenc_lab import ablate
    from posenc_lab.ablate.outdir import AblationDir

    out = tmp_path / "out"
    with contextlib.ExitStack() as held:
        if case == "ablate.out is a file":
            out.write_bytes(b"mine")
        else:
            held.enter_context(AblationDir(out).lock())
        before = _tree(tmp_path)
        code = ablate.main([*ABLATE_GRID, f"ablate.out={out}"])
        err = capsys.readouterr().err
        assert _tree(tmp_path) == before  # nothing written (the lock file is the holder's)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("posenc-lab ablate: error: "), err
    assert re.search(message, lines[0].split(": error: ", 1)[1]), lines[0]


# ---- the corpus cache recovers -----------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["manifest.json", "train.npy"])
def test_a_damaged_corpus_cache_is_named_and_rebuilt(tmp_path, caplog, damage):
    options = {"train_tokens": 5000, "eval_tokens": 1000, "max_distance": 20}
    first = load_corpus("recall", root=tmp_path, **options)
    reference = {s: first.split(s).copy() for s in ("train", "val", "test")}
    del first
    (damaged,) = tmp_path.rglob(damage)
    damaged.write_bytes(damaged.read_bytes()[: len(damaged.read_bytes()) // 3])
    with caplog.at_level("WARNING", logger="posenc_lab.data"):
        again = load_corpus("recall", root=tmp_path, **options)
    assert f"corpus cache {damaged.parent} is damaged" in caplog.text and damage in caplog.text
    assert all((again.split(s) == reference[s]).all() for s in reference)
    assert len(damaged.read_bytes()) > 0 and not list(tmp_path.rglob(".*.tmp*"))


# ---- the commands that are not Hydra's: compare and bench ----------------------------------------------

# bench kept to one tiny point, so that a check that does not hold costs a second, not a benchmark
BENCH = ["--configs", "tiny", "--schemes", "nope", "--memory", "off", "--warmup", "0", "--reps", "1"]


def _without_cuda(argv: list[str]) -> list[str]:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: --device cuda is valid here")
    return argv


# (id, command, arguments from (tmp_path, finished run), expected message after "error: ")
CLI_CASES = [
    ("compare: no streams", "compare", lambda t, f: [f, f, "--n-streams", "0"],
     r"^--n-streams must be an integer >= 1, got 0$"),
    ("compare: --out is a file", "compare", lambda t, f: [f, f, "--out", _file(t, "out", b"mine")],
     r"^--out=\S+/out: \S+/out is a file, not a folder; use another --out$"),
    ("compare: a run with itself", "compare", lambda t, f: [f, f],
     r"^A and B are the same run \(\S+\); compare two different runs or cells \(a run directory, or a folder of one "
     r"cell's seeds, on each side\)$"),
    ("bench: n_head does not divide d_model", "bench", lambda t, f: [*BENCH, "--model-set", "n_head=3"],
     r"^--model-set n_head=3 with --configs tiny: model\.n_head=3 does not divide model\.d_model=64; pick n_head "
     r"among the divisors of d_model$"),
    ("bench: --out under a file", "bench", lambda t, f: [*BENCH, "--out", _file(t, "out", b"mine") / "x.json"],
     r"^--out=\S+/out/x\.json: \S+/out is a file, not a folder; use another --out$"),
    ("bench: --device cuda without CUDA", "bench", lambda t, f: _without_cuda([*BENCH, "--device", "cuda"]),
     r"^--device cuda: this machine has no CUDA device \(torch\.cuda\.is_available\(\) is false\); use cpu$"),
    ("bench: a segment of no tokens", "bench", lambda t, f: [*BENCH, "--segment-len", "0"],
     r"^--segment-len must be an integer >= 1, got 0$"),
]  # fmt: skip


@pytest.mark.parametrize("case, command, args, message", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_every_bad_option_of_compare_and_bench_is_one_line_before_anything_runs(
    tmp_path, finished, capsys, case, command, args, message
):
    from posenc_lab_analysis import compare  # here: a training child imports this module for CutShort

    work = tmp_path / "work"
    work.mkdir()
    argv = [str(a) for a in args(work, finished)]
    before, finished_before = _tree(work), _tree(finished)
    code = {"compare": compare.main, "bench": bench.main}[command](argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"posenc-lab {command}: error: "), captured.err
    assert re.search(message, lines[0].split(": error: ", 1)[1]), lines[0]
    assert captured.out == ""  # refused before the environment line of a benchmark or any evaluation
    assert _tree(work) == before and _tree(finished) == finished_before


# ---- a text corpus cut short while a run trains ------------------------------------------------------


class CutShort(L.Callback):
    """Cuts ``path`` to half its size after the first training step: a user's file changed under a run."""

    def __init__(self, path: str):
        self.path = Path(path)

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == 1:
            os.truncate(self.path, self.path.stat().st_size // 2)


def test_a_text_file_cut_short_while_a_run_trains_leaves_the_run_its_copy_and_a_resume_is_one_line(tmp_path):
    """A memory map of a file that shrinks kills its reader with SIGBUS (rc 135 from a shell, no line): the run reads
    the cache's copy instead, and finishes; continuing it on the changed file is refused, naming the corpus."""
    text = tmp_path / "corpus.txt"
    text.write_bytes(np.random.default_rng(0).integers(0, 256, 60_000, dtype=np.uint8).tobytes())
    run, cache, corpus = tmp_path / "run", tmp_path / "cache", f"data.corpus.path={text}"
    cut = ["+callbacks.cut._target_=tests.test_one_line_errors.CutShort", f"+callbacks.cut.path={text}"]
    done = run_module("posenc_lab.train", *tiny(run, cache, corpus, *cut, data="textfile", steps=6))
    assert done.returncode == 0, done.stderr[-3000:]
    assert text.stat().st_size == 30_000 and '"steps": 6' in (run / "results.json").read_text()
    again = run_module("posenc_lab.train", *tiny(run, cache, corpus, data="textfile", steps=8))
    lines = [line for line in again.stderr.splitlines() if line.startswith("posenc-lab ")]
    assert again.returncode == 1 and "Traceback" not in again.stderr, again.stderr[-3000:]
    assert len(lines) == 1 and re.search(r"corpus\.n_tokens\.train: run 54000, now 27000", lines[0]), lines
    assert "corpus.sha256: run '" in lines[0]

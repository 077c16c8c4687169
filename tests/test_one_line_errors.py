"""The long tail (issue 23): every bad input is one line naming the key or the file and the fix, before
anything is written, through the real command entry points (in this process, as the console runs them)."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import pytest

from posenc_lab import evaluate
from posenc_lab import train as train_module
from posenc_lab.data import load_corpus
from tests.helpers_train import tiny
from tests.test_reliability import cli, no_stale_log_handlers  # noqa: F401 - an autouse fixture


def _file(tmp, name, content: bytes) -> Path:
    (tmp / name).write_bytes(content)
    return tmp / name


def _link(tmp, name, target) -> Path:
    os.symlink(target, tmp / name)
    return tmp / name


# fixed, so that a run cannot draw bytes that happen to begin like a pickle of another protocol (torch then warns)
RANDOM_BYTES = random.Random(0).randbytes(5000)

# (id, command, arguments from (tmp_path, cache, finished run), expected message after "error: ")
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
    ("random bytes as a checkpoint", "train",
     lambda t, c, f: tiny(t / "run", c, f"resume={_file(t, 'x.ckpt', RANDOM_BYTES)}"),
     r"checkpoint \S+/x\.ckpt cannot be read \(corrupt or not a checkpoint\)"),
    ("eval: random bytes as a checkpoint", "eval", lambda t, c, f: [f"ckpt={_file(t, 'x.ckpt', RANDOM_BYTES)}"],
     r"checkpoint \S+/x\.ckpt cannot be read \(corrupt or not a checkpoint\)"),
    ("eval: out_dir is a file", "eval",
     lambda t, c, f: [f"ckpt={f / 'checkpoints' / 'last.ckpt'}", f"out_dir={_file(t, 'out', b'mine')}"],
     r"out_dir=\S+/out/run-[0-9a-f]{8}/last: \S+/out is a file, not a folder; use another out_dir$"),
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


@pytest.mark.parametrize("case, command, args, message", CASES, ids=[c[0] for c in CASES])
def test_every_bad_input_is_one_line_before_anything_is_written(
    tmp_path, cache, finished, monkeypatch, capsys, case, command, args, message
):
    work = tmp_path / "work"
    work.mkdir()
    argv = args(work, cache, finished)
    before, finished_before = _tree(work), _tree(finished)
    code, err = cli(train_module.main if command == "train" else evaluate.main, argv, monkeypatch, capsys)
    lines = [line for line in err.splitlines() if line.startswith("posenc-lab ")]
    assert code == 1 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"posenc-lab {command}: error: "), err[-3000:]
    assert err.strip().endswith("(set HYDRA_FULL_ERROR=1 for the full traceback)")
    assert re.search(message, lines[0].split(": error: ", 1)[1]), lines[0]
    assert "Nothing in it was run" not in lines[0]  # damage is not called code
    assert _tree(work) == before and _tree(finished) == finished_before  # nothing written, nothing changed


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

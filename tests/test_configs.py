"""Every option of every config group of the real conf/ composes, and trains a few steps."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from posenc_lab.data import CORPUS_NAMES
from posenc_lab.positional import SCHEME_NAMES, Dims, build_scheme, scheme_options, sized_options
from posenc_lab.train import train
from tests.helpers_train import CONF_DIR, CORPUS, compose_config, tiny
from tests.schemes import ROPE

GROUPS = ("posenc", "model", "data", "trainer", "logger", "experiment")


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


ALL_OPTIONS = [(g, o) for g in GROUPS for o in options(g)]


@pytest.fixture(scope="module")
def fake_corpora(tmp_path_factory):
    """A cache root with small stand-ins for the downloaded corpora, and the overrides that use them."""
    root = tmp_path_factory.mktemp("cache")
    rng = random.Random(0)
    words = [w for w in "the of and to in a is that for it as was with be by on not he this are or".split()]
    text = " ".join(rng.choice(words) for _ in range(6000)).encode()[:12000]
    for name in ("enwik8", "text8"):
        (root / name).mkdir()
        (root / name / name).write_bytes(text)
    for name, folder in (("wikitext103", "wikitext-103"), ("wikitext2", "wikitext-2")):
        (root / name / folder).mkdir(parents=True)
        for split, n in (("train", 400), ("valid", 60), ("test", 60)):
            lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(n)]
            (root / name / folder / f"wiki.{split}.tokens").write_text("\n".join(lines) + "\n")
    textfile = root / "mine.txt"
    textfile.write_bytes(text)
    mahoney = ["data.corpus.expected_size=null", "data.corpus.split_sizes=[10000,1000,1000]"]
    extra = {
        "enwik8": mahoney,
        "text8": mahoney,
        "textfile": [f"data.corpus.path={textfile}"],
        "hf": [
            "data.corpus.path=text",  # datasets' own builder, one text per line, on the local file
            f"data.corpus.data_files={{train:{textfile},validation:{textfile},test:{textfile}}}",
        ],
    }
    return root, extra


def test_groups_are_complete():
    assert set(options("posenc")) == set(SCHEME_NAMES)
    assert set(options("data")) == set(CORPUS_NAMES)
    assert {"tiny", "small", "base"} <= set(options("model"))
    assert set(options("trainer")) == {"cpu", "gpu", "ddp", "ddp_cpu"}
    assert set(options("logger")) == {"csv", "wandb", "none"}


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_posenc_files_hold_the_scheme_options(scheme):
    cfg = compose_config("train", [f"posenc={scheme}"]).posenc
    assert cfg.name == scheme
    opts = {k: v for k, v in OmegaConf.to_container(cfg).items() if k != "name"}
    assert set(opts) == set(scheme_options(scheme))
    build_scheme(scheme, Dims(2, 64, 4), **sized_options(scheme, opts, segment_len=64, mem_len=64))  # nulls: the run's


@pytest.mark.parametrize("group,option", ALL_OPTIONS)
def test_every_option_composes(group, option, tmp_path):
    cfg = compose_config("train", [f"{group}={option}", f"run_dir={tmp_path}"])
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    assert resolved["run_dir"] == str(tmp_path)
    for key in ("posenc", "model", "data", "trainer", "optim", "seed"):
        assert key in resolved


def test_keys_that_scripts_rely_on():
    cfg = compose_config(
        "train",
        [
            f"posenc={ROPE}",
            "data=recall",
            "data.segment_len=24",
            "data.batch_size=6",
            "data.episode_len=240",
            "model.mem_len=48",
            "model.n_layer=3",
            "model.d_model=96",
            "model.n_head=6",
            "optim.lr=0.002",
            "trainer.max_steps=7",
            "seed=5",
        ],
    )
    assert (cfg.posenc.name, cfg.data.name, cfg.data.segment_len, cfg.data.batch_size, cfg.data.episode_len) == (
        ROPE,
        "recall",
        24,
        6,
        240,
    )
    assert (cfg.model.mem_len, cfg.model.n_layer, cfg.model.d_model, cfg.model.n_head) == (48, 3, 96, 6)
    assert (cfg.optim.lr, cfg.trainer.max_steps, cfg.seed, cfg.data.seed) == (0.002, 7, 5, 5)
    assert cfg.trainer.use_distributed_sampler is False
    eval_cfg = compose_config(
        "eval",
        ["ckpt=x.ckpt", "data.segment_len=64", "model.mem_len=128", "model.same_length=true", "dump_losses=true"],
    )
    assert (eval_cfg.data.segment_len, eval_cfg.model.mem_len, eval_cfg.model.same_length) == (64, 128, True)


def test_unknown_override_or_option_is_refused():
    with pytest.raises(ConfigCompositionException, match="nosuchkey"):
        compose_config("train", ["nosuchkey=1"])
    with pytest.raises(ConfigCompositionException, match="(?s)posenc/nosuch.*Available options"):
        compose_config("train", ["posenc=nosuch"])
    with pytest.raises(ConfigCompositionException, match="model.nosuch"):
        compose_config("train", ["model.nosuch=3"])


def _trains(group: str, option: str) -> bool:
    if group == "trainer" and option in ("gpu", "ddp"):
        return torch.cuda.is_available() and option == "gpu"
    return not (group == "trainer" and option == "ddp_cpu")  # tests/test_ddp.py runs it


@pytest.mark.parametrize("group,option", [(g, o) for g, o in ALL_OPTIONS if _trains(g, o)])
def test_every_option_trains_a_few_steps(group, option, tmp_path, fake_corpora, monkeypatch):
    root, extra = fake_corpora
    data = option if group == "data" else "recall"
    overrides = tiny(tmp_path / "run", root, f"{group}={option}", *extra.get(data, []), steps=2, data=data)
    if group == "experiment":  # the preset's choices, shrunk to a tiny model on small local data
        data = compose_config("train", [f"experiment={option}"]).data.name
        overrides = [
            f"experiment={option}",
            f"run_dir={tmp_path / 'run'}",
            f"data.root={root}",
            *CORPUS.get(data, []),
            *extra.get(data, []),
            "trainer.max_steps=2",
            "model.n_layer=2",
            "model.d_model=32",
            "model.n_head=2",
            "model.d_inner=64",
            "model.mem_len=16",
            "data.segment_len=16",
            "data.batch_size=4",
            "data.eval_batch_size=4",
            "trainer.val_check_interval=1000",
            "trainer.limit_val_batches=2",
            "final_eval.limit_batches=2",
            "trainer.enable_progress_bar=false",
        ]
    if group == "model" and option not in ("tiny",):
        overrides.append("model.mem_len=16")  # tiny() sets it for the tiny model; keep the others' sizes
        overrides = [o for o in overrides if o != "model=tiny"]
    if compose_config("train", [f"{group}={option}"]).model.adaptive_cutoffs:  # cutoffs inside the small vocabularies
        overrides.append("model.adaptive_cutoffs=[4,10]")
    if group == "logger" and option == "wandb":
        monkeypatch.setenv("WANDB_MODE", "offline")
        monkeypatch.setenv("WANDB_DIR", str(tmp_path))
        monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = compose_config("train", overrides)
    if data == "hf":  # the real datasets library, its cache in tmp_path, offline (more in test_hf.py)
        datasets = pytest.importorskip("datasets", reason="the dev extra installs datasets (pip install -e '.[dev]')")
        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    results = train(cfg)  # (conftest stops the wandb service this may start)
    assert results["steps"] == 2
    assert results["val"]["loss"] == pytest.approx(results["val"]["loss"])  # finite, not NaN
    assert Path(results["checkpoint"]).exists()
    if group == "logger" and option == "wandb":
        assert list(Path(tmp_path).glob("**/offline-run-*")), os.listdir(tmp_path)
    if group == "logger" and option == "csv":
        assert (tmp_path / "run" / "metrics.csv").exists()

"""Every option of every config group of the real conf/ composes, and trains a few steps; every default is
written once (the model and data options inherit their base and state only what they change; the Python
defaults that mirror conf/ equal it, value by value); the composed model and data nodes stay as pinned."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import random
import sys
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from posenc_lab.build import build_datamodule
from posenc_lab.data import CORPORA, CORPUS_NAMES
from posenc_lab.datamodule import SegmentDataModule
from posenc_lab.defaults import BASE, group_option, group_options
from posenc_lab.model import ModelConfig
from posenc_lab.positional import SCHEME_NAMES, Dims, build_scheme, scheme_options, sized_options
from posenc_lab.rundir import RunDir, corpus_identity
from posenc_lab.train import train
from tests.helpers_train import CONF_DIR, CORPUS, assert_finished_figures, compose_config, tiny
from tests.schemes import ROPE

GROUPS = ("posenc", "model", "data", "trainer", "logger", "experiment")


def options(group: str) -> list[str]:
    """The options of a group, the base that model/ and data/ options inherit aside."""
    return list(group_options(group))


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
    folder = root / "mine"  # textdir: 60 files in 20 folders, the text cut into pieces
    for i in range(60):
        (folder / f"part{i % 20}").mkdir(parents=True, exist_ok=True)
        (folder / f"part{i % 20}" / f"{i}.txt").write_bytes(text[i * 200 : (i + 1) * 200])
    mahoney = ["data.corpus.expected_size=null", "data.corpus.split_sizes=[10000,1000,1000]"]
    extra = {
        "enwik8": mahoney,
        "text8": mahoney,
        "textfile": [f"data.corpus.path={textfile}"],
        "textdir": [f"data.corpus.path={folder}"],
        "hf": [
            "data.corpus.path=text",  # datasets' own builder, one text per line, on the local file
            f"data.corpus.data_files={{train:{textfile},validation:{textfile},test:{textfile}}}",
        ],
    }
    return root, extra


def presets() -> list[str]:
    """The posenc options that preset another scheme (irope, rnope: a hybrid): their ``name`` is not their file's."""
    return [o for o in options("posenc") if group_option("posenc", o)["name"] != o]


def test_groups_are_complete():
    assert set(options("posenc")) - set(presets()) == set(SCHEME_NAMES)
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
    layers = len(opts.get("layers") or []) or 2  # a hybrid's whole pattern: a longer one than the model is refused
    build_scheme(
        scheme, Dims(layers, 64, 4), **sized_options(scheme, opts, segment_len=64, mem_len=64)
    )  # nulls: the run's


@pytest.mark.parametrize("preset", presets())
def test_a_posenc_preset_builds_the_registered_scheme_it_names(preset):
    """A preset (posenc=irope) is a registered scheme with some options set: it composes to that scheme's name and
    options, and builds for a 4-layer model with its nulls sized to a run."""
    cfg = OmegaConf.to_container(compose_config("train", [f"posenc={preset}"]).posenc)
    name = cfg.pop("name")
    assert name in SCHEME_NAMES and set(cfg) <= set(scheme_options(name))
    build_scheme(name, Dims(4, 64, 4), **sized_options(name, cfg, segment_len=64, mem_len=64))


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
    if group == "posenc" and (layers := compose_config("train", [f"posenc={option}"]).posenc.get("layers")):
        overrides.append(
            f"model.n_layer={len(layers)}"
        )  # a hybrid's whole pattern: a longer one than the model is refused
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
    assert_finished_figures(results)
    assert Path(results["checkpoint"]).exists()
    if group == "data":  # run.json records the hash of the corpus the run read
        recorded = RunDir(tmp_path / "run").identity()["corpus"]
        assert recorded == corpus_identity(build_datamodule(cfg.data).corpus) and recorded["name"] == option
    if group == "logger" and option == "wandb":
        assert list(Path(tmp_path).glob("**/offline-run-*")), os.listdir(tmp_path)
    if group == "logger" and option == "csv":
        assert (tmp_path / "run" / "metrics.csv").exists()


# ---- every default written once ---------------------------------------------------------------------------

INHERITING = ("model", "data")


def _own(group: str, option: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{option}.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in INHERITING for o in options(g)])
def test_an_option_inherits_its_base_and_states_only_what_it_changes(group, option):
    own = _own(group, option)
    assert own.pop("defaults") == [BASE]
    base = _own(group, BASE)
    restated = sorted(k for k, v in own.items() if k in base and base[k] == v)
    assert not restated, f"conf/{group}/{option}.yaml restates its base's {restated}"
    # what `group=option` composes is the base with the option's keys over it (defaults.group_option reads it so)
    composed = compose_config("train", [f"{group}={option}", "run_dir=x"])
    assert OmegaConf.to_container(composed[group]) == group_option(group, option) == {**base, **own}


def _python_defaults(fn) -> dict:
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


# ModelConfig fields that conf/model/ does not hold, and who owns their value
MODEL_FIELDS_ELSEWHERE = {
    "vocab_size": "the corpus (build.model_config)",
    "posenc": "conf/train.yaml's posenc choice (compared below)",
    "posenc_kwargs": "conf/posenc/<scheme>.yaml",
    "random_positions": "off unless +model.random_positions=P (no model option lists it)",
}


def test_model_config_defaults_are_conf_model_default():
    base = _own("model", BASE)
    fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    assert set(base) == set(fields) - set(MODEL_FIELDS_ELSEWHERE)
    python = ModelConfig()
    differ = {k: (getattr(python, k), v) for k, v in base.items() if getattr(python, k) != v}
    assert not differ, f"ModelConfig's defaults differ from conf/model/default.yaml's (Python, yaml): {differ}"
    assert python.posenc == compose_config("train", ["run_dir=x"]).posenc.name
    assert python.posenc_kwargs == {} and python.random_positions is None


def test_datamodule_defaults_are_conf_data_default():
    base = OmegaConf.to_container(compose_config("train", ["run_dir=x"]).data, resolve=True)
    python = _python_defaults(SegmentDataModule.__init__)
    python.pop("corpus")  # each corpus option's own node (below)
    assert set(python) <= set(base)
    assert {k: base[k] for k in python} == python


@pytest.mark.parametrize("corpus", CORPUS_NAMES)
def test_every_corpus_yaml_holds_its_loaders_defaults(corpus):
    node = group_option("data", corpus).get("corpus", {})
    python = _python_defaults(CORPORA[corpus])
    required = {k for k, v in node.items() if v == "???"}
    assert required == set(inspect.signature(CORPORA[corpus]).parameters) - set(python) - {"root"}
    differ = {k: (_plain(python[k]), v) for k, v in node.items() if k not in required and _plain(python[k]) != v}
    assert not differ, f"conf/data/{corpus}.yaml's corpus node differs from its loader's defaults: {differ}"


# ---- composed configs stay as they were --------------------------------------------------------------------

PINNED = Path(__file__).parent / "data" / "composed_model_data.json"


def composed_model_data() -> dict:
    """{"model=tiny": {"model": ..., "data": ...}, ...}: the resolved model and data nodes of every model and data
    option and every experiment preset."""
    out = {}
    for group in ("model", "data", "experiment"):
        for option in options(group):
            cfg = OmegaConf.to_container(compose_config("train", [f"{group}={option}", "run_dir=x"]), resolve=True)
            out[f"{group}={option}"] = {"model": cfg["model"], "data": cfg["data"]}
    return out


def test_composed_model_and_data_nodes_are_as_pinned():
    """A change of a value in conf/model/ or conf/data/ (or an experiment's model and data) shows here. Pin an
    intended one with `python -m tests.test_configs --pin`, and say so in the commit."""
    assert composed_model_data() == json.loads(PINNED.read_text())


if __name__ == "__main__" and sys.argv[1:] == ["--pin"]:
    PINNED.write_text(json.dumps(composed_model_data(), indent=1, sort_keys=True) + "\n")

"""The `hf` corpus with the real `datasets` library on local files (no Hub): datasets' own "text" and
"json" builders, the byte-level join, the cache, clear errors, and `data=hf` training a few steps."""

import json
import sys

import pytest

from posenc_lab.data import load_corpus
from posenc_lab.train import train
from tests.helpers_train import assert_finished_figures, compose_config, tiny

SPLITS = {"train": ["héllo wörld", "second line", "", "a third"], "validation": ["valid text"], "test": ["t1", "t2"]}


@pytest.fixture
def datasets(tmp_path, monkeypatch):
    """The real library, its cache in tmp_path and offline (nothing may reach the Hub)."""
    datasets = pytest.importorskip("datasets", reason="the dev extra installs datasets (pip install -e '.[dev]')")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return datasets


@pytest.fixture
def text_files(tmp_path):
    """{split: path} of one text file per split, one text per line."""
    files = {}
    for split, lines in SPLITS.items():
        files[split] = tmp_path / f"{split}.txt"
        files[split].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return files


def test_text_files_become_bytes_joined_by_the_separator(datasets, text_files, tmp_path):
    c = load_corpus("hf", root=tmp_path / "cache", path="text", data_files={k: str(v) for k, v in text_files.items()})
    # datasets' text builder yields one row per line (the empty line too), without the newline
    assert bytes(c.train) == "\n".join(SPLITS["train"]).encode("utf-8")
    assert bytes(c.val) == b"valid text" and bytes(c.test) == b"t1\nt2"
    assert (c.vocab_size, c.unit) == (256, "byte")


def test_the_second_load_needs_only_the_cache_until_a_file_changes(datasets, text_files, tmp_path, monkeypatch):
    files = {k: str(v) for k, v in text_files.items()}
    load_corpus("hf", root=tmp_path / "cache", path="text", data_files=files)
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    assert bytes(load_corpus("hf", root=tmp_path / "cache", path="text", data_files=files).test) == b"t1\nt2"
    text_files["test"].write_text("changed\n")
    with pytest.raises(ImportError):  # an edited file is prepared again, which needs datasets
        load_corpus("hf", root=tmp_path / "cache", path="text", data_files=files)


def test_json_lines_with_another_text_field_and_split_names(datasets, tmp_path):
    for split, texts in (("tr", ["α", "β"]), ("va", ["v"]), ("te", ["t"])):
        rows = [{"id": i, "body": t} for i, t in enumerate(texts)]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = load_corpus(
        "hf",
        root=tmp_path / "cache",
        path="json",
        text_field="body",
        separator=" | ",
        splits=("tr", "va", "te"),
        data_files={s: str(tmp_path / f"{s}.jsonl") for s in ("tr", "va", "te")},
    )
    assert bytes(c.train).decode() == "α | β" and bytes(c.val) == b"v"


def test_bad_inputs_are_clear_errors(datasets, text_files, tmp_path):
    files = {k: str(v) for k, v in text_files.items()}
    with pytest.raises(FileNotFoundError, match="no data file at .*missing.txt"):
        load_corpus("hf", root=tmp_path, path="text", data_files={**files, "test": str(tmp_path / "missing.txt")})
    with pytest.raises(ValueError, match=r"no field text_field='body'; available: \['text'\]"):
        load_corpus("hf", root=tmp_path, path="text", data_files=files, text_field="body")
    with pytest.raises(ValueError, match=r"no split \['valid'\]; available: \['train', 'validation', 'test'\]"):
        load_corpus("hf", root=tmp_path, path="text", data_files=files, splits=("train", "valid", "test"))
    # a Hub dataset that is not in the (empty) cache, offline
    with pytest.raises(RuntimeError, match="could not load dataset 'no-such-user/no-such-dataset'.*Offline"):
        load_corpus("hf", root=tmp_path, path="no-such-user/no-such-dataset")


def test_without_datasets_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ImportError, match=r"pip install posenc-lab\[hf\]"):
        load_corpus("hf", root=tmp_path, path="wikitext", config="wikitext-2-raw-v1")


def test_data_hf_trains_on_local_files(datasets, text_files, tmp_path):
    # long enough for a few segments of 16 bytes in 4 streams
    text_files["train"].write_text("".join(f"line {i} of the training text\n" for i in range(400)))
    text_files["validation"].write_text("".join(f"validation {i}\n" for i in range(60)))
    text_files["test"].write_text("".join(f"test {i}\n" for i in range(60)))
    files = ",".join(f"{k}:{v}" for k, v in text_files.items())
    cfg = compose_config(
        "train",
        tiny(
            tmp_path / "run",
            tmp_path / "cache",
            "data.corpus.path=text",
            f"data.corpus.data_files={{{files}}}",
            steps=2,
            data="hf",
        ),
    )
    results = train(cfg)
    assert results["steps"] == 2
    assert_finished_figures(results)
    assert results["val"]["bpb"] > 0  # a byte corpus reports bits per byte

"""textdir, a folder of your own files (posenc_lab/data/textdir.py; its split by family: test_families.py): a cache
that follows the content, not the time stamps; what is read through symbolic links and odd names; a folder the
split cannot hold out refused before it is read; its path stored absolute."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

from posenc_lab.data import load_corpus
from posenc_lab.data import textdir as textdir_module
from posenc_lab.data.families import FILE_SEPARATOR
from posenc_lab.data.overlap import near_duplicate_groups
from posenc_lab.errors import ConfigError
from posenc_lab.evaluate import OtherCorpusError, evaluate_checkpoint
from posenc_lab.rundir import RunDir, RunDirError, corpus_identity
from posenc_lab.train import train
from tests.helpers_train import compose_config, tiny


def notes(root: Path, folders: int = 24) -> Path:
    """``folders`` top-level folders of two notes each (lines no other note has): a folder the split can hold out."""
    for i in range(folders):
        (root / f"topic{i:02d}").mkdir(parents=True)
        for k in range(2):
            lines = "".join(f"note {i}-{k}, line {j}: {i * 7919 + k * 104729 + j * 31}\n" for j in range(20 + i % 5))
            (root / f"topic{i:02d}" / f"note{k}.txt").write_text(lines)
    return root


def _files(cache: Path) -> dict[str, list[str]]:
    (manifest,) = cache.glob("textdir/*/manifest.json")
    return json.loads(manifest.read_text())["info"]["files"]


def _same_size_same_mtime(path: Path) -> None:
    """Other text of the same size, the modification time put back (``cp -p``, ``rsync -a``)."""
    before = path.stat()
    text = path.read_bytes()
    path.write_bytes(text.swapcase() if text.swapcase() != text else text[::-1])
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


# ---- the cache follows the content -----------------------------------------------------------------


def test_same_size_text_with_its_mtime_kept_is_read_again_and_changes_the_corpus_hash(tmp_path):
    """The cache was once keyed on sizes and modification times, so it served the old text."""
    folder, cache = notes(tmp_path / "notes"), tmp_path / "cache"
    first = load_corpus("textdir", root=cache, path=folder)
    before = corpus_identity(first)["sha256"]
    edited = folder / "topic03" / "note1.txt"
    old = edited.read_bytes()
    _same_size_same_mtime(edited)
    again = load_corpus("textdir", root=cache, path=folder)
    text = b"".join(bytes(again.split(s)) for s in ("train", "val", "test"))
    assert edited.read_bytes() + FILE_SEPARATOR in text and old not in text  # the new text is served
    assert corpus_identity(again)["sha256"] != before


def test_a_run_trained_on_the_old_text_is_refused_by_resume_and_eval(tmp_path):
    """The same edit under a finished run: resuming it and evaluating it both refuse the changed corpus."""
    folder, cache, run = notes(tmp_path / "notes"), tmp_path / "cache", tmp_path / "run"
    args = (f"data.corpus.path={folder}",)
    train(compose_config("train", tiny(run, cache, *args, data="textdir", steps=2)))
    _same_size_same_mtime(folder / "topic03" / "note1.txt")
    with pytest.raises(RunDirError, match=r"corpus\.sha256: run '[0-9a-f]{64}', now '[0-9a-f]{64}'"):
        train(compose_config("train", tiny(run, cache, *args, data="textdir", steps=4)))
    with pytest.raises(OtherCorpusError, match=r"its run\.json records sha256 [0-9a-f]{64}, the corpus now gives"):
        evaluate_checkpoint(run / "checkpoints" / "last.ckpt", max_batches=1)


# ---- what is read: symbolic links, names that are not UTF-8 -------------------------------------------


def test_links_to_files_and_folders_are_both_followed_each_file_read_once(tmp_path):
    """The rule of the module doc: a link is read as what it points to, a file or a folder, inside the tree or
    out of it; a file or folder reached twice is read once (the first path the walk reaches); a loop ends."""
    folder, outside = notes(tmp_path / "notes"), tmp_path / "outside"
    (outside / "shelf").mkdir(parents=True)
    (outside / "letter.txt").write_text("a letter kept elsewhere\n")
    (outside / "shelf" / "book.txt").write_text("a book on a shelf elsewhere\n")
    os.symlink(outside / "letter.txt", folder / "topic00" / "linked_letter.txt")  # a file out of the tree
    os.symlink(outside / "shelf", folder / "shelf")  # a folder out of the tree
    os.symlink(folder / "topic01" / "note0.txt", folder / "topic00" / "again.txt")  # a second path to a file
    os.symlink(folder, folder / "topic02" / "loop")  # a loop: the tree inside itself
    listed = textdir_module.text_files(folder, "**/*")
    assert "topic00/linked_letter.txt" in listed and "shelf/book.txt" in listed
    assert "topic00/again.txt" not in listed and "topic01/note0.txt" in listed
    assert not any("/loop/" in name for name in listed)
    assert len(listed) == 24 * 2 + 2
    corpus = load_corpus("textdir", root=tmp_path / "cache", path=folder)
    text = b"".join(bytes(corpus.split(s)) for s in ("train", "val", "test"))
    assert b"a letter kept elsewhere" in text and b"a book on a shelf elsewhere" in text


def test_the_glob_keeps_pathlibs_meaning(tmp_path):
    """``**`` is any number of folders (none included), ``*`` one name; a pattern ending in ``**`` names folders."""
    folder = notes(tmp_path / "notes", folders=2)
    (folder / "top.md").write_text("top\n")
    (folder / "topic00" / "deep").mkdir()
    (folder / "topic00" / "deep" / "x.md").write_text("deep\n")
    assert textdir_module.text_files(folder, "**/*.md") == ["top.md", "topic00/deep/x.md"]
    assert textdir_module.text_files(folder, "*.md") == ["top.md"]
    assert textdir_module.text_files(folder, "topic0?/*.txt") == [
        f"topic0{i}/note{k}.txt" for i in (0, 1) for k in (0, 1)
    ]
    assert textdir_module.text_files(folder, "topic00/**") == []


def test_a_file_name_that_is_not_utf8_is_read_and_shown_with_its_bytes_escaped(tmp_path):
    """A name of os.fsencode surrogates failed with "surrogates not allowed", naming no file. Names
    are only keys: the file is read, and the manifest shows its undecodable byte as \\xe9."""
    folder = notes(tmp_path / "notes")
    odd = os.fsdecode(b"caf\xe9.txt")
    (folder / "topic05" / odd).write_bytes(b"an odd name, a plain text\n")
    corpus = load_corpus("textdir", root=tmp_path / "cache", path=folder)
    files = _files(tmp_path / "cache")
    (split,) = [s for s, names in files.items() if "topic05/caf\\xe9.txt" in names]
    assert b"an odd name, a plain text\n" + FILE_SEPARATOR in bytes(corpus.split(split))
    json.dumps(files, ensure_ascii=False).encode()  # no surrogate reaches the manifest or the tables


# ---- a folder the split cannot hold out: refused before it is read ------------------------------------------


@pytest.mark.parametrize("layout", ["one file", "12 top-level folders"])
def test_a_folder_the_split_cannot_hold_out_is_refused_before_any_file_is_read(tmp_path, monkeypatch, layout):
    """One 81 MB file once took 4 minutes and 6.4 GB to fail with "use a larger corpus"."""
    folder = tmp_path / "notes"
    if layout == "one file":
        folder.mkdir()
        (folder / "book.txt").write_text("one long book\n" * 500)
        has = r"it has 1 file: 0 top-level folders and 1 file at the top, the smallest 100\.0% of the bytes"
    else:
        notes(folder, folders=12)
        has = r"it has 24 files: 12 top-level folders and 0 files at the top, the smallest [78]\.\d% of the bytes"

    def read(*args):
        raise AssertionError("a file was read")

    monkeypatch.setattr(textdir_module, "read_files", read)
    with pytest.raises(ValueError, match=r"val takes families of at most 5% of the bytes, test of at most 10%, so it "
                       r"needs 2 or more of at most 10%, one of them at most 5%; " + has):  # fmt: skip
        load_corpus("textdir", root=tmp_path / "cache", path=folder)
    assert not (tmp_path / "cache").exists()


def test_a_folder_whose_families_leave_a_split_empty_is_refused_once_they_are_known(tmp_path):
    """The listing passes (two small files at the top), but the two are copies: one family of 8%, which val (at most
    5%) cannot take. One line, as before the read, and no cache entry."""
    folder = notes(tmp_path / "notes", folders=1)
    big = "".join(f"line {j} of the big folder: {j * 7919}\n" for j in range(4000))
    (folder / "topic00" / "big.txt").write_text(big)
    copy = "".join(f"a copied line {j}: {j * 104729}\n" for j in range(len(big) // 25 // 24))
    for name in ("a.txt", "b.txt"):
        (folder / name).write_text(copy)
    refused = (
        r"^textdir corpus: \S+/notes \(data\.corpus\.path\): the split by family .*; it has 5 files: 1 top-level "
        r"folder and 2 files at the top, joined into 2 families by shared text, and the val split gets none of them; "
        r"put its files in more top-level folders"
    )
    with pytest.raises(ValueError, match=refused):
        load_corpus("textdir", root=tmp_path / "cache", path=folder)
    assert not list((tmp_path / "cache").rglob("manifest.json"))


def test_near_duplicates_are_found_in_memory_proportional_to_the_text(tmp_path):
    """The overlap pass held 58 bytes a token at its peak on two 2 MB texts (6.4 GB for an 81 MB folder):
    now 24 (numpy's allocations, as tracemalloc counts them), the same groups (a shared stretch joins them)."""
    rng = np.random.default_rng(0)
    shared = rng.integers(97, 123, 400_000, dtype=np.uint8)
    texts = [np.concatenate([shared, rng.integers(97, 123, 1_600_000, dtype=np.uint8)]) for _ in range(2)]
    tracemalloc.start()
    try:
        groups = near_duplicate_groups(texts, 0.1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert groups[0] == groups[1]
    assert peak / sum(map(len, texts)) < 30, peak / sum(map(len, texts))


# ---- the path is stored absolute -------------------------------------------------------------------------


def test_a_relative_path_is_stored_absolute_and_an_older_relative_one_names_the_override(tmp_path, monkeypatch):
    """run.json once stored data.corpus.path as typed; evaluated from another folder the run failed
    with "no folder at ..." and no hint. Now run.json, config.yaml and the checkpoint hold it absolute; a run of
    before (its path relative) still resumes from where it was typed, and from elsewhere eval names
    +data.corpus.path, with which it evaluates on the same corpus (its hash compared)."""
    folder, cache, run = notes(tmp_path / "work" / "notes"), tmp_path / "cache", tmp_path / "run"
    monkeypatch.chdir(tmp_path / "work")
    train(compose_config("train", tiny(run, cache, "data.corpus.path=notes", data="textdir", steps=2)))
    assert RunDir(run).identity()["data"]["corpus"]["path"] == str(folder)
    assert f"path: {folder}\n" in (run / "config.yaml").read_text()
    ckpt = run / "checkpoints" / "last.ckpt"
    monkeypatch.chdir(tmp_path)
    assert evaluate_checkpoint(ckpt, max_batches=1)["other_corpus"] is False  # from another folder

    # a run of before: its path as typed, relative
    record = json.loads((run / "run.json").read_text())
    record["identity"]["data"]["corpus"]["path"] = "notes"
    (run / "run.json").write_text(json.dumps(record))
    saved = torch.load(ckpt, weights_only=False)
    saved["hyper_parameters"]["config"]["data"]["corpus"]["path"] = "notes"
    torch.save(saved, ckpt)
    with pytest.raises(ConfigError, match=r"^the corpus of run \S+/run is not there: data\.corpus\.path='notes', "
                       r"relative to the folder it was trained from, which from \S+ is \S+/notes; pass "
                       r"\+data\.corpus\.path=PATH where it is now"):  # fmt: skip
        evaluate_checkpoint(ckpt, max_batches=1)
    moved = evaluate_checkpoint(ckpt, max_batches=1, data_overrides={"corpus": {"path": str(folder)}})
    assert moved["other_corpus"] is False and moved["corpus_sha256"] == moved["run_corpus_sha256"]
    monkeypatch.chdir(tmp_path / "work")  # where it was typed: the same run, it extends
    train(compose_config("train", tiny(run, cache, "data.corpus.path=notes", data="textdir", steps=3)))
    assert json.loads((run / "results.json").read_text())["steps"] == 3

"""The split by family (posenc_lab/data/families.py): the default corpus's held-out splits designed for inference,
the split rule itself, each token's family, and textdir, a folder of your own files."""

import json
import platform
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from posenc_lab.data import cache_root, load_corpus
from posenc_lab.data.families import FILE_SEPARATOR, HELD_OUT, MAX_FAMILY_SHARE, split_by_family
from tests.data.helpers_pystdlib import _source, manifest


def _split_of(manifest_info: dict) -> dict[str, str]:
    return {f: split for split, names in manifest_info["files"].items() for f in names}


def test_pystdlib_test_split_is_designed_for_inference():
    """The default corpus on this Python: val and test hold at least 30 families each, none over 10% of its
    split's bytes (the split's rule is 5%: 44 and 54 families, the largest 5.0% and 4.9%, on 3.11.7); near-
    duplicates stay on one side (the codec tables of encodings/, posixpath and ntpath); at 64 bytes under 2% of
    the test split's contexts occur in train, at 32 bytes the idioms of Python source remain (5.7% measured;
    28.7% when the split went file by file)."""
    from posenc_lab.data.overlap import shared_context_share

    c = load_corpus("pystdlib")
    total = sum(len(c.split(s)) for s in ("train", "val", "test"))
    for split in ("val", "test"):
        sizes = c.family_sizes(split)
        assert len(sizes) >= 30 and sizes.max() <= 0.10 * sizes.sum(), (split, len(sizes), sizes.max() / sizes.sum())
        assert sizes.sum() == len(c.split(split)) >= HELD_OUT[split] * total
        assert len(np.unique(c.documents(split))) >= len(sizes) == len(c.family_labels(split))
    (entry,) = [p for p in (cache_root() / "pystdlib").glob("*/manifest.json") if _default_key(p)]
    split_of = _split_of(json.loads(entry.read_text())["info"])
    assert len({split_of[f] for f in split_of if f.startswith("encodings/")}) == 1
    assert split_of["posixpath.py"] == split_of["ntpath.py"]  # a cross-package family, found by its overlap
    assert shared_context_share(c.train, c.test, 64) < 0.02
    assert shared_context_share(c.train, c.test, 32) < 0.08


def _default_key(manifest_path: Path) -> bool:
    """The cache entry of ``load_corpus("pystdlib")`` on this Python."""
    key = json.loads(manifest_path.read_text())["key"]
    stdlib = str(Path(sysconfig.get_paths()["stdlib"]).resolve())
    python = (key["stdlib"], key["python"], key["version"]) == (stdlib, platform.python_version(), 3)
    return python and key["max_bytes"] is None and not key["include_tests"]


def test_the_split_by_family_holds_out_small_families_whole_up_to_their_shares():
    """400 families of 1-20 files of random sizes and 5 giants (each 8% of the bytes): the held-out splits take
    whole families of at most MAX_FAMILY_SHARE of their share until they hold it; the giants train."""
    rng = np.random.default_rng(0)
    names, sizes, family = [], [], []
    for f in range(405):
        for k in range(int(rng.integers(1, 20)) if f < 400 else 1):
            names.append(f"pkg{f}/file{k}.txt")
            family.append(f)
            sizes.append(int(rng.integers(100, 3000)) if f < 400 else 0)
    giant = int(0.08 / 0.6 * sum(sizes))  # five of them: 40% of the new total
    for i, f in enumerate(family):
        sizes[i] = giant if f >= 400 else sizes[i]
    split_of = split_by_family(names, sizes, family)
    assert split_by_family(names, sizes, family) == split_of  # deterministic
    total = sum(sizes)
    by_family: dict[int, set[str]] = {}
    for name, f in zip(names, family):
        by_family.setdefault(f, set()).add(split_of[name])
    assert all(len(splits) == 1 for splits in by_family.values())  # whole families
    assert all(by_family[f] == {"train"} for f in range(400, 405))
    for split, share in HELD_OUT.items():
        held = {f for f, (s,) in by_family.items() if s == split}
        bytes_of = {f: sum(sz for sz, g in zip(sizes, family) if g == f) for f in held}
        assert share * total <= sum(bytes_of.values()) <= (share + MAX_FAMILY_SHARE * share) * total
        assert max(bytes_of.values()) <= MAX_FAMILY_SHARE * sum(bytes_of.values())
        assert len(held) >= 1 / MAX_FAMILY_SHARE


def test_families_of_a_split_follow_its_documents(tmp_path, fake_stdlib):
    c = load_corpus("pystdlib", root=tmp_path / "cache", stdlib_dir=fake_stdlib)
    files = manifest(tmp_path / "cache")["info"]["files"]
    for split in ("train", "val", "test"):
        fam, docs = c.families(split), c.documents(split)
        assert len(fam) == len(c.split(split)) and fam[0] == 0  # numbered in text order
        assert np.all(np.diff(np.unique(fam, return_index=True)[1]) > 0)
        assert c.family_sizes(split).sum() == len(c.split(split))
        of_file = dict(zip(files[split], fam[np.unique(docs, return_index=True)[1]]))
        pkg = {of_file[f] for f in of_file if f.startswith("pkg/")}
        codecs = {of_file[f] for f in of_file if f.startswith("codec_")}
        assert len(pkg) <= 1 and len(codecs) <= 1  # a package, and a near-duplicate pair: one family each
        assert len(set(of_file.values())) == len(c.family_labels(split))
    recall = load_corpus("recall", root=tmp_path / "cache", train_tokens=20_000, eval_tokens=20_000)
    assert np.array_equal(recall.families("test"), recall.documents("test"))  # no families: its chunks


# ---------------------------------------------------------------- textdir: a folder of your own


def _table(seed: int) -> str:
    return "".join(f"{seed:03d}-{k:05d} = {k * 7919 % 100003:06d} ; generated row\n" for k in range(8))


@pytest.fixture
def text_tree(tmp_path):
    """40 folders of notes, 30 loose files, 8 near-duplicate pairs across folders (a table and its copy with a
    new header), a file holding the separator byte, a hidden folder and a file the glob leaves out."""
    root = tmp_path / "notes"
    for i in range(40):
        for k in range(i % 3 + 1):
            (root / f"topic{i}").mkdir(parents=True, exist_ok=True)
            (root / f"topic{i}" / f"note{k}.txt").write_text(_source(1000 + 10 * i + k))
    for i in range(30):
        (root / f"loose{i}.txt").write_text(_source(2000 + i))
    for i in range(8):
        (root / f"tables{i}").mkdir()
        (root / f"tables{i}" / "t.txt").write_text(f"# table {i}\n" + _table(i))
        (root / f"copies{i}").mkdir()
        (root / f"copies{i}" / "c.txt").write_text(f"# a copy of table {i}, edited\n" + _table(i))
    (root / "binary.txt").write_bytes(b"head \x1c inside a file \x1c twice\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD.txt").write_text("ref: refs/heads/main\n")
    (root / "image.png").write_bytes(b"\x89PNG not text")
    return root


def test_textdir_splits_a_folder_by_family(tmp_path, text_tree):
    c = load_corpus("textdir", root=tmp_path / "cache", path=text_tree, glob="**/*.txt")
    assert (c.name, c.unit, c.vocab_size) == ("textdir", "byte", 256)
    (path,) = (tmp_path / "cache" / "textdir").glob("*/manifest.json")
    files = json.loads(path.read_text())["info"]["files"]
    split_of = _split_of({"files": files})
    assert set(split_of) == {p.relative_to(text_tree).as_posix() for p in text_tree.rglob("*.txt")} - {".git/HEAD.txt"}
    for i in range(8):  # a near-duplicate pair in two folders: one family, one split
        assert split_of[f"tables{i}/t.txt"] == split_of[f"copies{i}/c.txt"]
    assert {split_of[f"tables{i}/t.txt"] for i in range(8)} != {"train"}  # some pairs are held out together
    for i in range(40):  # a folder: one split
        assert len({s for f, s in split_of.items() if f.startswith(f"topic{i}/")}) == 1
    for split in ("train", "val", "test"):  # files in path order, each ending with the separator
        assert bytes(c.split(split)) == b"".join((text_tree / f).read_bytes() + FILE_SEPARATOR for f in files[split])
        assert len(np.unique(c.documents(split))) == len(files[split])  # the separator inside a file is no end
    again = load_corpus("textdir", root=tmp_path / "cache", path=text_tree, glob="**/*.txt")
    assert isinstance(again.train, np.memmap)
    (text_tree / "loose0.txt").write_text("changed\n")  # an edited file: prepared again
    changed = load_corpus("textdir", root=tmp_path / "cache", path=text_tree, glob="**/*.txt")
    assert len(list((tmp_path / "cache" / "textdir").glob("*/manifest.json"))) == 2
    assert sum(map(len, (changed.train, changed.val, changed.test))) != sum(map(len, (c.train, c.val, c.test)))

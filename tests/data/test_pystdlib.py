"""pystdlib, Python's standard library as a corpus (posenc_lab/data/pystdlib.py):
the split by family, disjoint and exact, and its cache."""

import sysconfig
from pathlib import Path

import numpy as np
import pytest

import posenc_lab.data.families as family_split
from posenc_lab.data import load_corpus
from posenc_lab.data.families import FILE_SEPARATOR
from posenc_lab.data.pystdlib import stdlib_files
from tests.data.helpers_pystdlib import manifest


def test_pystdlib_split_is_by_family_disjoint_and_exact(tmp_path, fake_stdlib):
    c = load_corpus("pystdlib", root=tmp_path / "cache", stdlib_dir=fake_stdlib)
    files = manifest(tmp_path / "cache")["info"]["files"]
    assert sum(map(len, files.values())) == 65 and all(files.values())
    split_of = {f: s for s, names in files.items() for f in names}
    assert len({split_of[f"pkg/part{i}.py"] for i in range(3)}) == 1  # a package stays together
    assert split_of["codec_a.py"] == split_of["codec_b.py"]  # near-duplicates found by overlap stay together
    assert not any(set(files[a]) & set(files[b]) for a, b in [("train", "val"), ("train", "test"), ("val", "test")])
    assert all(f.endswith(".py") and "tests" not in f and "test/" not in f for f in sum(files.values(), []))
    for split in ("train", "val", "test"):
        expect = b"".join((fake_stdlib / f).read_bytes() + FILE_SEPARATOR for f in files[split])
        assert bytes(getattr(c, split)) == expect
    with_tests = stdlib_files(fake_stdlib, include_tests=True)
    assert "test/test_a.py" in with_tests and "site-packages/foo.py" not in with_tests


def test_pystdlib_cached_second_load_is_identical(tmp_path, fake_stdlib, monkeypatch):
    a = load_corpus("pystdlib", root=tmp_path, stdlib_dir=fake_stdlib)
    monkeypatch.setattr(family_split, "families", lambda *a: pytest.fail("second load rebuilt the corpus"))
    b = load_corpus("pystdlib", root=tmp_path, stdlib_dir=fake_stdlib)
    assert isinstance(b.train, np.memmap)
    assert all(np.array_equal(getattr(a, s), getattr(b, s)) for s in ("train", "val", "test"))


def test_pystdlib_real_stdlib_capped(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_LAB_CACHE", str(tmp_path / "env"))  # the default root honours the env
    c = load_corpus("pystdlib", max_bytes=200_000)
    d = load_corpus("pystdlib", root=tmp_path / "other", max_bytes=200_000)
    assert (c.vocab_size, c.unit) == (256, "byte") and c.train.dtype == np.uint8
    assert (len(c.train), len(c.val), len(c.test)) == (170_000, 10_000, 20_000)
    assert all(np.array_equal(getattr(c, s), getattr(d, s)) for s in ("train", "val", "test"))
    assert b"def " in bytes(c.train) and b"import " in bytes(c.val)
    files = manifest(tmp_path / "env")["info"]["files"]
    assert not set(files["train"]) & set(files["val"])
    assert len(stdlib_files(Path(sysconfig.get_paths()["stdlib"]))) > 300

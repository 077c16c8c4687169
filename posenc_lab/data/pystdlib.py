"""pystdlib, the embedded default corpus: the byte-level source of the running Python's standard library.

Files are the documents. They are split 85/5/10 (train/val/test, by bytes; the test split judges the
report's verdicts, so it gets more documents) by *family*, never file by file: the standard library
holds families of near-identical files (106 generated codec tables in ``encodings/``, ``posixpath`` and
``ntpath``, the mail-protocol clients, ...) and split file by file their members land on both sides,
so that held-out text could be recited from train. A family is a top-level package (every file under
``asyncio/`` is one family) joined with every file that shares at least FAMILY_OVERLAP of its 32-byte
windows with it (``overlap.near_duplicate_groups``). Families are taken in the order of a hash of their
first path and fill val, then test, up to HELD_OUT shares of the bytes; the rest is train. Each file ends with
FILE_SEPARATOR (the corpus's document separator).
"""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from pathlib import Path

import numpy as np

from .cache import cached, key_dir
from .overlap import near_duplicate_groups
from .registry import Corpus, register_corpus
from .splits import SPLITS

FILE_SEPARATOR = b"\x1c"  # ASCII "file separator", after every file
FAMILY_OVERLAP = 0.1
HELD_OUT = {"val": 0.05, "test": 0.10}  # shares of the bytes
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
_TEST_DIRS = {"test", "tests", "idle_test"}


def stdlib_files(stdlib: Path, include_tests: bool = False) -> list[str]:
    """Relative paths ('/'-separated) of the .py files under `stdlib`, sorted."""
    skip = _SKIP_DIRS if include_tests else _SKIP_DIRS | _TEST_DIRS
    found = []
    for dirpath, dirnames, filenames in os.walk(stdlib):
        dirnames[:] = [d for d in dirnames if d not in skip]
        rel = Path(dirpath).relative_to(stdlib)
        found += [(rel / f).as_posix() for f in filenames if f.endswith(".py")]
    return sorted(found)


def families(files: list[str], texts: list[bytes]) -> list[int]:
    """A family id per file: its top-level package, joined with its near-duplicates in other packages."""
    groups = near_duplicate_groups([np.frombuffer(t, np.uint8) for t in texts], FAMILY_OVERLAP)
    parent = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for i, rel in enumerate(files):
        parent[find(("file", i))] = find(("package", rel.split("/")[0]))
        parent[find(("file", i))] = find(("overlap", groups[i]))
    roots = {}
    return [roots.setdefault(find(("file", i)), len(roots)) for i in range(len(files))]


def split_of_families(files: list[str], sizes: list[int], family: list[int]) -> dict[str, str]:
    """file -> "train" | "val" | "test": families in hash order fill val, then test, to their HELD_OUT shares."""
    members: dict[int, list[int]] = {}
    for i, f in enumerate(family):
        members.setdefault(f, []).append(i)
    order = sorted(members.values(), key=lambda m: hashlib.md5(files[m[0]].encode()).hexdigest())
    total = sum(sizes)
    used = {"val": 0, "test": 0}
    out = {}
    for m in order:
        size = sum(sizes[i] for i in m)
        split = next((s for s in HELD_OUT if used[s] + size <= HELD_OUT[s] * total), "train")
        if split != "train":
            used[split] += size
        out.update({files[i]: split for i in m})
    return out


@register_corpus("pystdlib", unit="byte")
def load_pystdlib(
    root: Path,
    *,
    max_bytes: int | None = None,
    include_tests: bool = False,
    stdlib_dir: str | os.PathLike | None = None,
) -> Corpus:
    """Byte-level corpus of the running Python's standard library sources (vocab 256).

    Files are split by family (module docstring) and concatenated in path order with FILE_SEPARATOR
    after each; `max_bytes` caps the total (in the same shares) for quick runs.
    """
    stdlib = Path(stdlib_dir or sysconfig.get_paths()["stdlib"]).resolve()
    if not stdlib.is_dir():
        raise FileNotFoundError(f"pystdlib: no standard library directory at {stdlib}")
    if max_bytes is not None and max_bytes < 100:
        raise ValueError(f"pystdlib: max_bytes must be None or >= 100, got {max_bytes}")
    key = {
        "version": 2,  # 2: split by family (1: file by file)
        "stdlib": str(stdlib),
        "python": platform.python_version(),
        "max_bytes": max_bytes,
        "include_tests": include_tests,
    }

    def build():
        rels = stdlib_files(stdlib, include_tests)
        texts = [(stdlib / rel).read_bytes() + FILE_SEPARATOR for rel in rels]
        split_of = split_of_families(rels, [len(t) for t in texts], families(rels, texts))
        fractions = {"train": 1 - sum(HELD_OUT.values()), **HELD_OUT}
        arrays, used = {}, {}
        for split in SPLITS:
            budget = None if max_bytes is None else int(max_bytes * fractions[split])
            parts, size = [], 0
            for rel, text in zip(rels, texts):
                if split_of[rel] != split or (budget is not None and size >= budget):
                    continue
                parts.append(text)
                size += len(text)
            arrays[split] = np.frombuffer(b"".join(parts)[:budget], dtype=np.uint8)
            used[split] = [rel for rel in rels if split_of[rel] == split][: len(parts)]
        return arrays, None, {"files": used}

    arrays, _, _ = cached(key_dir(root / "pystdlib", key), key, build)
    return Corpus("pystdlib", **arrays, vocab_size=256, document_separator=FILE_SEPARATOR[0])

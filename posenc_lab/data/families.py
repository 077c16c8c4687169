"""The split by family, shared by the corpora whose documents are the files of a folder tree (pystdlib, textdir).

Files are the documents, each ending with FILE_SEPARATOR. They are split train/val/test by *family*, never file by
file: a tree holds families of near-identical files (generated tables, copied modules, one file in two dialects),
and split file by file their members land on both sides, so that held-out text could be recited from train. A
family is a top-level folder (its *package*: every file under ``asyncio/`` is one family; a file at the top is a
package of its own) joined with every file that shares at least FAMILY_OVERLAP of its 32-byte windows with it
(``overlap.near_duplicate_groups``), transitively.

The held-out splits are designed for inference (their families are the units of the report's intervals): val and
test take families in the order of a hash of their first path, each family held out only if it is at most
MAX_FAMILY_SHARE of that split's HELD_OUT share of the bytes, until the split holds its share. So no family holds
more than MAX_FAMILY_SHARE of a held-out split, and a split holds at least 1 / MAX_FAMILY_SHARE families (on this
machine's Python 3.11 standard library: 44 in val, 54 in test). The larger families are trained on, never held
out: nothing is dropped, and what the held-out splits judge is text in families of at most that size. A tree too
small to fill a share this way (a few families) then fills it as before, with any family that fits in what is
left of the share. A tree where no family can be held out (one file, a few large folders) is refused in one line
saying what the split needs (``held_out_problem``): from the listing alone before any file is read where the
top-level folders tell (families only join them), else once the families are known.

File names are keys only: one that is not UTF-8 (``os.fsencode``) is read as any other, and shown in the
manifest and the report's tables with its undecodable bytes as ``\\xNN`` (``shown``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from .cache import cached, key_dir
from .overlap import near_duplicate_groups
from .registry import Corpus
from .splits import SPLITS

FILE_SEPARATOR = b"\x1c"  # ASCII "file separator", after every file
FAMILY_OVERLAP = 0.1
HELD_OUT = {"val": 0.05, "test": 0.10}  # shares of the bytes; train holds the rest
MAX_FAMILY_SHARE = 0.05  # the largest family a held-out split takes, as a share of that split's bytes


def package(name: str) -> str:
    """The top-level folder of a '/'-separated relative path (a file at the top: the file itself)."""
    return name.split("/")[0]


def shown(name: str) -> str:
    """A file name for the manifest and tables: its bytes not UTF-8 (surrogates of ``os.fsdecode``) as ``\\xNN``."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'s' * (n != 1)}"


def held_out_problem(names: Sequence[str], sizes: Sequence[int], family: Sequence[int] | None = None) -> str | None:
    """Why the split by family cannot hold out val and test (a clause: "the split by family ..."), or None.

    ``family`` None: judged on the listing alone, each top-level folder (or file at the top) a family; families
    only join them, so a problem found so holds for the families (one folder of 81 MB is refused before it is
    read). With ``family``: whether ``split_by_family`` leaves val or test without a file."""
    packages: dict[str, int] = {}
    for name, size in zip(names, sizes):
        packages[package(name)] = packages.get(package(name), 0) + size
    total = max(sum(sizes), 1)
    needs = (
        f"the split by family holds out whole families (a top-level folder or a file at the top, with the files "
        f"that share text with it): val takes families of at most {HELD_OUT['val']:.0%} of the bytes, test of at "
        f"most {HELD_OUT['test']:.0%}"
    )
    folders = len({package(n) for n in names if "/" in n})
    has = (
        f"{_count(len(names), 'file')}: {_count(folders, 'top-level folder')} and "
        f"{_count(len(packages) - folders, 'file')} at the top"
    )
    if family is None:
        fits = {s: sum(size <= HELD_OUT[s] * total for size in packages.values()) for s in HELD_OUT}
        if fits["val"] >= 1 and fits["test"] >= 2:
            return None
        smallest = min(packages.values()) / total
        return (
            f"{needs}, so it needs 2 or more of at most {HELD_OUT['test']:.0%}, one of them at most "
            f"{HELD_OUT['val']:.0%}; it has {has}, the smallest {smallest:.1%} of the bytes"
        )
    split_of = split_by_family(names, sizes, family)
    empty = [s for s in HELD_OUT if s not in split_of.values()]
    if not empty:
        return None
    return (
        f"{needs}; it has {has}, joined into {len(set(family)):,} families by shared text, and the {empty[0]} "
        f"split gets none of them"
    )


def families(names: Sequence[str], texts: Sequence[bytes]) -> list[int]:
    """A family id per file: its package, joined with its near-duplicates in other packages."""
    groups = near_duplicate_groups([np.frombuffer(t, np.uint8) for t in texts], FAMILY_OVERLAP)
    parent: dict = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for i, name in enumerate(names):
        parent[find(("file", i))] = find(("package", package(name)))
        parent[find(("file", i))] = find(("overlap", groups[i]))
    roots: dict = {}
    return [roots.setdefault(find(("file", i)), len(roots)) for i in range(len(names))]


def split_by_family(names: Sequence[str], sizes: Sequence[int], family: Sequence[int]) -> dict[str, str]:
    """name -> "train" | "val" | "test", whole families at a time (the module doc)."""
    members: dict[int, list[int]] = {}
    for i, f in enumerate(family):
        members.setdefault(f, []).append(i)
    # a name's bytes as the file system has them (not UTF-8: its surrogates as the bytes they stand for)
    order = sorted(
        members.values(), key=lambda m: hashlib.md5(names[m[0]].encode("utf-8", "surrogateescape")).hexdigest()
    )
    share = {s: f * sum(sizes) for s, f in HELD_OUT.items()}
    used = dict.fromkeys(HELD_OUT, 0)
    out: dict[str, str] = {}
    left = []
    for m in order:  # families of at most MAX_FAMILY_SHARE of a share, until each split holds its share
        size = sum(sizes[i] for i in m)
        split = next((s for s in HELD_OUT if used[s] < share[s] and size <= MAX_FAMILY_SHARE * share[s]), None)
        if split is None:
            left.append(m)
            continue
        used[split] += size
        out.update({names[i]: split for i in m})
    for m in left:  # a small tree: any family that fits in what is left of a share
        size = sum(sizes[i] for i in m)
        split = next((s for s in HELD_OUT if used[s] + size <= share[s]), "train")
        if split != "train":
            used[split] += size
        out.update({names[i]: split for i in m})
    return out


def family_label(names: Sequence[str]) -> str:
    """A family's name for tables: its packages ("asyncio", "ntpath.py+posixpath.py", "codecs.py+encodings+2")."""
    packages = sorted({shown(package(n)) for n in names})
    return "+".join(packages[:2]) + (f"+{len(packages) - 2}" if len(packages) > 2 else "")


def family_corpus(
    name: str,
    root: Path,
    key: dict,
    names: Callable[[], list[str]],
    read: Callable[[str], bytes],
    max_bytes=None,
    source: str = "",
    fix: str = "",
) -> Corpus:
    """The byte-level corpus of the files ``names()`` (read by ``read(name)``), split by family, cached under
    ``root/name`` by ``key``. Each split is its files in path order, each followed by FILE_SEPARATOR; ``max_bytes``
    caps the total (each split at its share, its first files in path order) for quick runs. The corpus carries,
    per split, every document's length and family (``Corpus.families``), and the manifest lists the files. A tree
    whose families leave val or test empty is refused (``held_out_problem``), naming ``source`` and ``fix``."""

    def build():
        rels = names()
        texts = [read(rel) + FILE_SEPARATOR for rel in rels]
        family = families(rels, texts)
        if problem := held_out_problem(rels, [len(t) for t in texts], family):
            raise ValueError(f"{name} corpus: {source + ': ' if source else ''}{problem}{'; ' + fix if fix else ''}")
        split_of = split_by_family(rels, [len(t) for t in texts], family)
        fractions = {"train": 1 - sum(HELD_OUT.values()), **HELD_OUT}
        arrays: dict[str, np.ndarray] = {}
        info: dict[str, dict] = {"files": {}, "families": {}}
        for split in SPLITS:
            budget = None if max_bytes is None else int(max_bytes * fractions[split])
            taken, size = [], 0
            for i, rel in enumerate(rels):
                if split_of[rel] != split or (budget is not None and size >= budget):
                    continue
                taken.append(i)
                size += len(texts[i])
            tokens = b"".join(texts[i] for i in taken)[:budget]
            ends = np.minimum(np.cumsum([len(texts[i]) for i in taken], dtype=np.int64), len(tokens))
            ids: dict[int, int] = {}  # families numbered from 0 in text order
            doc_family = [ids.setdefault(family[i], len(ids)) for i in taken]
            arrays[split] = np.frombuffer(tokens, dtype=np.uint8)
            arrays[f"{split}.documents"] = np.diff(ends, prepend=0)
            arrays[f"{split}.families"] = np.asarray(doc_family, dtype=np.int64)
            info["files"][split] = [shown(rels[i]) for i in taken]
            members = {f: [rels[i] for i in taken if family[i] == f] for f in ids}
            info["families"][split] = [family_label(members[f]) for f in ids]
        return arrays, None, info

    arrays, _, info = cached(key_dir(root / name, key), key, build)
    return Corpus(
        name,
        *(arrays[s] for s in SPLITS),
        vocab_size=256,
        document_separator=FILE_SEPARATOR[0],
        document_lengths={s: arrays[f"{s}.documents"] for s in SPLITS},
        document_families={s: arrays[f"{s}.families"] for s in SPLITS},
        family_names=dict(info["families"]),
    )

"""pystdlib, the embedded default corpus: the byte-level source of the running Python's standard library.

Files are the documents, split 85/5/10 (train/val/test, by bytes; the test split judges the report's verdicts,
so it gets more documents) by *family* (``families.py``, shared with textdir): the standard library holds
families of near-identical files (106 generated codec tables in ``encodings/``, ``posixpath`` and ``ntpath``, the
mail-protocol clients, ...) that must stay on one side. A family is a top-level package joined with every file
that shares 10% of its 32-byte windows with it; val and test hold only families of at most 5% of their bytes
(many independent units for the report's intervals), the larger packages (asyncio, email, tkinter, ...) train.
"""

from __future__ import annotations

import os
import platform
import sysconfig
from pathlib import Path

from .families import FILE_SEPARATOR, HELD_OUT, families, family_corpus, split_by_family
from .registry import Corpus, register_corpus

# the split of this corpus, for the tests and the overlap figures
__all__ = ["FILE_SEPARATOR", "HELD_OUT", "families", "load_pystdlib", "split_by_family", "stdlib_files"]

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


@register_corpus("pystdlib", unit="byte")
def load_pystdlib(
    root: Path,
    *,
    max_bytes: int | None = None,
    include_tests: bool = False,
    stdlib_dir: str | os.PathLike | None = None,
) -> Corpus:
    """Byte-level corpus of the running Python's standard library sources (vocab 256), split by family
    (``families.family_corpus``); `max_bytes` caps the total (in the same shares) for quick runs. Another folder
    of your own: the ``textdir`` corpus."""
    stdlib = Path(stdlib_dir or sysconfig.get_paths()["stdlib"]).resolve()
    if not stdlib.is_dir():
        raise FileNotFoundError(f"pystdlib: no standard library directory at {stdlib}")
    if max_bytes is not None and max_bytes < 100:
        raise ValueError(f"pystdlib: max_bytes must be None or >= 100, got {max_bytes}")
    key = {
        "version": 3,  # 3: held-out families of at most 5% of their split, with their families (2: by family)
        "stdlib": str(stdlib),
        "python": platform.python_version(),
        "max_bytes": max_bytes,
        "include_tests": include_tests,
    }
    return family_corpus(
        "pystdlib",
        root,
        key,
        lambda: stdlib_files(stdlib, include_tests),
        lambda rel: (stdlib / rel).read_bytes(),
        max_bytes,
    )

"""textdir: a folder of your own files as a byte-level corpus, every file a document, split by family as pystdlib
(``families.py``: a top-level folder is a family, joined with the files that share windows with it)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .families import family_corpus
from .registry import Corpus, register_corpus


def text_files(directory: Path, glob: str) -> list[str]:
    """Relative paths ('/'-separated, sorted) of the files under ``directory`` that ``glob`` matches, hidden files
    and files in hidden folders (a name starting with '.', such as .git) aside."""
    found = []
    for p in directory.glob(glob):
        rel = p.relative_to(directory)
        if p.is_file() and not any(part.startswith(".") for part in rel.parts):
            found.append(rel.as_posix())
    return sorted(found)


@register_corpus("textdir", unit="byte")
def load_textdir(root: Path, *, path: str | os.PathLike, glob: str = "**/*", max_bytes: int | None = None) -> Corpus:
    """Byte-level corpus of the files under ``path`` that ``glob`` matches (vocab 256), split by family; cached
    until a file is added, removed or changed (its size or modification time). ``max_bytes`` caps the total (in
    the same shares) for quick runs."""
    directory = Path(path).expanduser().resolve()
    if not directory.is_dir():
        raise FileNotFoundError(f"textdir corpus: no folder at {directory} (data.corpus.path)")
    if max_bytes is not None and max_bytes < 100:
        raise ValueError(f"textdir corpus: max_bytes must be null or >= 100, got {max_bytes} (data.corpus.max_bytes)")
    try:
        files = text_files(directory, glob)
    except (ValueError, NotImplementedError) as e:  # pathlib: an empty or absolute pattern
        raise ValueError(
            f"textdir corpus: data.corpus.glob={glob!r} is not a relative pattern ({e}); e.g. '**/*.txt'"
        ) from None
    if not files:
        raise ValueError(
            f"textdir corpus: no file under {directory} (data.corpus.path) matches data.corpus.glob={glob!r} "
            f"(hidden files and folders are skipped); use another path or glob, e.g. '**/*.txt'"
        )
    stamps = hashlib.sha256()
    for rel in files:
        stat = (directory / rel).stat()
        stamps.update(f"{rel}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    key = {"version": 1, "path": str(directory), "glob": glob, "max_bytes": max_bytes, "files": stamps.hexdigest()}
    return family_corpus("textdir", root, key, lambda: files, lambda rel: (directory / rel).read_bytes(), max_bytes)

"""textdir: a folder of your own files as a byte-level corpus, every file a document, split by family as pystdlib
(``families.py``: a top-level folder is a family, joined with the files that share windows with it).

What is read, and when it is read again:

- The files are those under the folder whose path matches ``glob`` (pathlib's syntax: ``*`` within a name, ``**``
  any folders), hidden files and folders (a name starting with '.', such as .git) aside.
- A symbolic link is read as what it points to, a file or a folder alike, wherever it points (a Hugging Face
  snapshot or a git-annex tree is links into other folders); each file and folder is read once: a link to a file
  or folder of the tree adds nothing (it keeps its own path), a loop of links ends, and two links to one place
  outside read it under the first (in name order). A link to nothing is refused in one line naming it: it
  stands for a file whose text is missing. Other special files (sockets, devices, pipes) are skipped.
- A file name that is not UTF-8 is read like any other (names are only keys); the manifest and the report's
  tables show its undecodable bytes as ``\\xNN``.
- Every load reads every file and hashes its content (BLAKE2b, while reading): the cache is keyed on that
  hash, never on sizes or modification times, so a file replaced by other text of the same size with its time
  kept (``cp -p``, ``rsync -a``) is prepared again, and run.json's corpus hash, taken from the tokens, changes.
  On a warm cache the reading is the whole cost (100 MB in 3,000 files).
- A folder the split by family cannot hold out val and test of (one file, a few large top-level folders) is
  refused in one line saying what the split needs, from the listing alone, before any file is read.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
from pathlib import Path, PurePosixPath

from .cache import DIGEST
from .families import FILE_SEPARATOR, family_corpus, held_out_problem, shown
from .registry import Corpus, register_corpus

_FIX = (
    "put its files in more top-level folders (20 or more of similar size), or split one file by position: data=textfile"
)


def _pattern(glob: str) -> tuple[str, ...]:
    """The components of ``glob``; ValueError naming data.corpus.glob unless it is a relative pattern."""
    parts = PurePosixPath(glob).parts if isinstance(glob, str) else ()
    if not parts or parts[0] == "/" or ".." in parts:
        raise ValueError(
            f"textdir corpus: data.corpus.glob={glob!r} is not a pattern of paths inside data.corpus.path "
            f"(relative, without '..'); e.g. '**/*.txt'"
        )
    return parts


def _matches(parts: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    """Whether a file's relative path (its components) matches the pattern, as pathlib's glob: ``**`` is any
    number of folders (never the file's own name), every other component one name (fnmatch, case-sensitive)."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_matches(parts[i:], pattern[1:]) for i in range(len(parts)))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _matches(parts[1:], pattern[1:])


def text_files(directory: Path, glob: str) -> list[str]:
    """Relative paths ('/'-separated, sorted) of the files under ``directory`` that ``glob`` matches, hidden files
    and folders aside, symbolic links followed: the tree itself first, then its links (a file or folder reached
    twice keeps its own path, else the first link's); ValueError naming a link to nothing."""
    pattern = _pattern(glob)
    found: list[str] = []
    seen: set[tuple[int, int]] = set()  # (device, inode) of every folder and file taken
    links: list[tuple[str, ...]] = []  # met while walking, followed after the tree that holds them

    def take(parts: tuple[str, ...], path: Path) -> None:
        if not _matches(parts, pattern):
            return
        try:
            st = os.stat(path)
        except OSError as e:
            target = f" to {shown(os.readlink(path))}" if path.is_symlink() else ""
            raise ValueError(
                f"textdir corpus: {shown(str(path))} (a symbolic link{target}) cannot be read: {e.strerror}; remove "
                f"it, fetch what it names, or leave it out with data.corpus.glob"
                if target
                else f"textdir corpus: cannot read {shown(str(path))}: {e.strerror}"
            ) from None
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:  # sockets, devices, pipes: no text
            seen.add((st.st_dev, st.st_ino))
            found.append("/".join(parts))

    def walk(top: Path, prefix: tuple[str, ...]) -> None:
        for folder, dirs, names in os.walk(top):  # links are not entered here, but kept in ``links``
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in seen:  # a loop, or a folder already read
                dirs[:] = []
                continue
            seen.add((st.st_dev, st.st_ino))
            rel = prefix + Path(folder).relative_to(top).parts
            entered = []
            for name in sorted(dirs):
                if not name.startswith("."):
                    (links if os.path.islink(os.path.join(folder, name)) else entered).append(rel + (name,))
            dirs[:] = [parts[-1] for parts in entered]
            for name in sorted(names):
                if name.startswith("."):
                    continue
                if os.path.islink(os.path.join(folder, name)):
                    links.append(rel + (name,))
                else:
                    take(rel + (name,), Path(folder, name))

    walk(directory, ())
    for parts in links:  # grows while linked folders are walked
        path = directory.joinpath(*parts)
        walk(path, parts) if path.is_dir() else take(parts, path)
    return sorted(found)


def read_files(directory: Path, files: list[str]) -> tuple[dict[str, bytes], str]:
    """({name: bytes}, hex BLAKE2b of every name and content): the files read once, hashed as they are read."""
    digest, texts = hashlib.new(DIGEST), {}
    for rel in files:
        try:
            with open(directory / rel, "rb") as f:
                text = f.read()
        except OSError as e:
            raise ValueError(f"textdir corpus: cannot read {shown(str(directory / rel))}: {e.strerror}") from None
        digest.update(rel.encode("utf-8", "surrogateescape") + b"\0" + len(text).to_bytes(8, "little"))
        digest.update(text)
        texts[rel] = text
    return texts, digest.hexdigest()


@register_corpus("textdir", unit="byte")
def load_textdir(root: Path, *, path: str | os.PathLike, glob: str = "**/*", max_bytes: int | None = None) -> Corpus:
    """Byte-level corpus of the files under ``path`` that ``glob`` matches (vocab 256), split by family; cached by
    the hash of their content (the module doc). ``max_bytes`` caps the total (in the same shares) for quick runs."""
    directory = Path(path).expanduser().resolve()
    if not directory.is_dir():
        raise FileNotFoundError(f"textdir corpus: no folder at {shown(str(directory))} (data.corpus.path)")
    if max_bytes is not None and max_bytes < 100:
        raise ValueError(f"textdir corpus: max_bytes must be null or >= 100, got {max_bytes} (data.corpus.max_bytes)")
    files = text_files(directory, glob)
    where = f"{shown(str(directory))} (data.corpus.path)"
    if not files:
        raise ValueError(
            f"textdir corpus: no file under {where} matches data.corpus.glob={glob!r} "
            f"(hidden files and folders are skipped); use another path or glob, e.g. '**/*.txt'"
        )
    sizes = [os.stat(directory / rel).st_size + len(FILE_SEPARATOR) for rel in files]
    if problem := held_out_problem(files, sizes):  # before a byte is read: an 81 MB file took 4 minutes to refuse
        raise ValueError(f"textdir corpus: {where}: {problem}; {_FIX}")
    texts, content = read_files(directory, files)
    key = {"version": 2, "path": str(directory), "glob": glob, "max_bytes": max_bytes, DIGEST: content}
    # texts.pop: each text is freed once the build has taken it
    return family_corpus("textdir", root, key, lambda: files, texts.pop, max_bytes, source=where, fix=_FIX)

"""What a plain pickle file would import or call, read without running it (checkpoints.read_checkpoint names it
when it refuses a file)."""

from __future__ import annotations

import os
import pickletools
from pathlib import Path

_CODE_OPCODES = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD"}


def code_in_pickle(path: Path) -> str | None:
    """The first opcode of a plain pickle file that would import or call code (read, never run), None if there
    is none; ValueError if the bytes are not a pickle at all (corruption). A legacy (non-zip) torch.save file is
    several pickles in a row (a magic number, the protocol, system info, the data) followed by raw tensor bytes:
    each pickle is read in turn until those bytes begin."""
    with open(path, "rb") as f:
        size, first = os.fstat(f.fileno()).st_size, True
        while f.tell() < size:
            strings: list[str] = []
            try:
                for op, arg, _ in pickletools.genops(f):  # raises ValueError on bytes that are no pickle
                    if op.name in _CODE_OPCODES:
                        what = (
                            arg if op.name == "GLOBAL" else " ".join(strings[-2:]) if op.name == "STACK_GLOBAL" else ""
                        )
                        return f"a {op.name} opcode" + (f" ({what})" if what else "")
                    if isinstance(arg, str):
                        strings.append(arg)
            except ValueError:
                if first:
                    raise
                return None  # the raw tensor bytes after the pickles of a legacy torch file
            first = False
    return None

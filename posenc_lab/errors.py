"""Errors posenc-lab raises on purpose, and how the command line reports them.

``PosencLabError`` marks an error whose message is the whole story (it names the key, file or
setting and what would be valid): the ``train`` / ``eval`` commands print it as one line and exit
with status 1; ``HYDRA_FULL_ERROR=1`` re-raises it for the full traceback. Subclasses also derive
from the builtin they refine (``ConfigError(ValueError)``), so ``except ValueError`` still works.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


class PosencLabError(Exception):
    """An error raised on purpose, with a message that says what is wrong and what would do."""


class ConfigError(PosencLabError, ValueError):
    """A config value is invalid; the message names the key (``optim.lr must be > 0, got -1.0``)."""


# Bad input that posenc_lab's own code (model, data, schemes) raises as a builtin, with a message
# written for the user: reported as one line too when the raise statement is in posenc_lab/.
_USER_FACING = (ValueError, FileNotFoundError, ImportError)


def deliberate(error: BaseException) -> bool:
    """True if ``error`` was raised on purpose by posenc-lab (its message is enough)."""
    if isinstance(error, PosencLabError):
        return True
    if not isinstance(error, _USER_FACING) or error.__traceback__ is None:
        return False
    innermost = traceback.extract_tb(error.__traceback__)[-1].filename
    return Path(innermost).resolve().is_relative_to(PACKAGE_DIR)


@contextlib.contextmanager
def reported(command: str) -> Iterator[None]:
    """Run a command's body; turn a deliberate error into one line on stderr and exit status 1."""
    try:
        yield
    except Exception as e:
        if not deliberate(e) or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"posenc-lab {command}: error: {e}\n(set HYDRA_FULL_ERROR=1 for the full traceback)", file=sys.stderr)
        sys.exit(1)

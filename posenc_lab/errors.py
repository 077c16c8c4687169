"""Errors posenc-lab raises on purpose, and how the command line reports them.

``PosencLabError`` marks an error whose message is the whole story (it names the key, file or
setting and what would be valid): the ``train`` / ``eval`` commands print it as one line and exit
with status 1; ``HYDRA_FULL_ERROR=1`` re-raises it for the full traceback. Subclasses also derive
from the builtin they refine (``ConfigError(ValueError)``), so ``except ValueError`` still works.

A stop signal (SIGTERM from a scheduler, SIGINT from Ctrl-C, SIGHUP from a closed terminal or session) becomes
``Interrupted``: one line and exit status 128 + the signal's number (143, 130, 129), never 0, which a scheduler
would record as success.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent


class PosencLabError(Exception):
    """An error raised on purpose, with a message that says what is wrong and what would do."""


class RunDirError(PosencLabError, ValueError):
    """The run directory cannot take this run; the message names the folder and the reason."""


class ConfigError(PosencLabError, ValueError):
    """A config value is invalid; the message names the key (``optim.lr must be > 0, got -1.0``)."""


class OverrideError(ConfigError):
    """An override of the command line that Hydra's grammar cannot read: the message names it and the nearest valid
    form; no traceback would say more (``reported`` prints the message alone)."""


# Bad input that posenc_lab's own code (model, data, schemes) raises as a builtin, with a message
# written for the user: reported as one line too when the raise statement is in posenc_lab/.
_USER_FACING = (ValueError, FileNotFoundError, ImportError)


# What an error line echoes of one value: a longer one is cut (``shown``), so that a 200,000-character value makes
# no 400 KB line; long enough for a path.
ECHO_LIMIT = 200


def shown(value: Any, limit: int = ECHO_LIMIT, quote: bool = True) -> str:
    """``value`` as an error line echoes it: its repr (``quote=False``: its text); past ``limit`` characters its
    head, an ellipsis and its length, ``'aaaa...' (200000 chars)``. Every one-line error echoes values through it."""
    text = str(value) if isinstance(value, str) or not quote else repr(value)
    if len(text) <= limit:
        return repr(value) if quote else text
    head = text[:limit] + "..."
    return f"{head!r} ({len(text)} chars)" if quote and isinstance(value, str) else f"{head} ({len(text)} chars)"


def bounded(line: str, limit: int = 2 * ECHO_LIMIT) -> str:
    """``line`` with every run of over ``limit`` non-space characters cut as ``shown`` cuts a value: what an error
    line printer applies to messages whose values were echoed whole (a scheme's or a corpus's own check)."""
    return re.sub(rf"\S{{{limit + 1},}}", lambda m: shown(m[0], limit, quote=False), line)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Interrupted(PosencLabError):
    """A stop signal ended the command; ``reported`` prints the message and exits with 128 + the signal number.
    ``saved``: the checkpoint saved on the way out, if any. ``quiet``: a DDP rank other than 0, which prints
    nothing and exits 0: rank 0 tells the story and its status is the job's (Lightning's local launcher would
    SIGKILL rank 0 on seeing another rank exit non-zero first; srun and torchrun fail the job on rank 0's)."""

    def __init__(self, signum: int, message: str, saved: str | None = None, quiet: bool = False):
        super().__init__(message)
        self.signum, self.saved, self.quiet = int(signum), saved, quiet

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


@contextlib.contextmanager
def stop_at_once(
    signals: tuple[int, ...] = STOP_SIGNALS, raising: Callable[[int], BaseException] | None = None
) -> Iterator[None]:
    """While the body runs, each of ``signals`` raises ``raising(signum)`` (default Interrupted) where the program
    is, as Ctrl-C raises KeyboardInterrupt (files are written atomically, io.py: nothing is left half-written).
    Training replaces this with a stop at the end of the step (checkpoints.Checkpointing).

    A signal received wins however the body ends: code that catches ``Exception`` (Hydra's compose, a config
    check) can swallow the raised error or replace it by its own (an ``UnboundLocalError`` in a ``finally`` it
    interrupted, read as "does not compose"); the body's end then raises the stop again, from what it became."""
    make = raising or (lambda signum: Interrupted(signum, f"stopped by {signal_name(signum)}"))
    received: list[int] = []

    def stop(signum, frame):
        for s in signals:  # the cleanup on the way out is not interrupted again (as Lightning does for Ctrl-C)
            signal.signal(s, signal.SIG_IGN)
        received.append(signum)
        raise make(signum)

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    previous = {s: signal.signal(s, stop) for s in signals}
    try:
        yield
    except BaseException as e:
        if received and not _is_stop(e, received[0]):
            raise make(received[0]) from e
        raise
    else:
        if received:  # swallowed on the way
            raise make(received[0])
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _is_stop(e: BaseException, signum: int) -> bool:
    return getattr(e, "signum", None) == signum


def no_space(e: BaseException | None) -> bool:
    """True if ``e`` or an exception behind it is ENOSPC / EDQUOT (torch wraps it in a RuntimeError)."""
    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        e = e.__cause__ or e.__context__
    return False


# What torch's allocators say when they refuse (the CPU's "DefaultCPUAllocator: can't allocate memory", "not enough
# memory" on Windows; "CUDA out of memory" of torch versions before torch.OutOfMemoryError)
_ALLOCATOR_REFUSED = re.compile(r"can't allocate memory|not enough memory|out of memory", re.IGNORECASE)


def _refusal(e: BaseException | None) -> BaseException | None:
    """``e`` or the exception behind it that is an allocator's refusal (``out_of_memory``), if any."""
    torch = sys.modules.get("torch")  # only an error torch raised can be torch's: no import here
    gpu_error = getattr(torch, "OutOfMemoryError", ()) if torch is not None else ()
    while e is not None:
        if isinstance(e, (gpu_error, MemoryError)) or (
            isinstance(e, RuntimeError) and _ALLOCATOR_REFUSED.search(str(e))
        ):
            return e
        e = e.__cause__ or e.__context__
    return None


def out_of_memory(e: BaseException | None) -> str | None:
    """Where memory ran out if ``e`` or an exception behind it is an allocator's refusal: "GPU" for
    torch.OutOfMemoryError (torch.cuda.OutOfMemoryError is the same class), "CPU" for a MemoryError or torch's CPU
    allocator's RuntimeError; None otherwise."""
    refusal = _refusal(e)
    if refusal is None:
        return None
    gpu = type(refusal).__name__ == "OutOfMemoryError" or re.search(r"CUDA|HIP|MPS", str(refusal))
    return "GPU" if gpu else "CPU"


def _allocator_said(e: BaseException) -> str:
    """The allocator's own words, first sentences only (CUDA's message goes on for lines about fragmentation)."""
    refusal = _refusal(e) or e
    text = re.sub(r"^\[enforce fail at [^\]]*\][^.]*\.\s*", "", " ".join(str(refusal).split()))  # c10's prefix
    short = re.match(r"(.*?(?:allocate [\d.,]+ ?[KMGT]?i?B|bytes)\b\.?)", text)
    return shown(short.group(1) if short else text or type(refusal).__name__, 160, quote=False)


def deliberate(error: BaseException) -> bool:
    """True if ``error`` was raised on purpose by posenc-lab (its message is enough)."""
    if isinstance(error, PosencLabError):
        return True
    if not isinstance(error, _USER_FACING) or error.__traceback__ is None:
        return False
    innermost = traceback.extract_tb(error.__traceback__)[-1].filename
    return Path(innermost).resolve().is_relative_to(PACKAGE_DIR)


@contextlib.contextmanager
def reported(command: str, memory_advice: Callable[[], str] | None = None) -> Iterator[None]:
    """Run a command's body; turn a deliberate error (or a full disk, or memory running out) into one line on stderr
    and exit status 1 (a stop signal: 128 + its number). ``memory_advice``: the command's sizes, what to lower and
    what was kept, for the line of an allocator's refusal (``out_of_memory``) on the CPU or a GPU."""
    try:
        yield
    except Interrupted as e:
        if e.quiet:
            sys.exit(0)
        try:
            fresh_line = "\n" if sys.stderr.isatty() else ""  # a progress bar may hold the terminal's line
            sys.stderr.write(f"{fresh_line}posenc-lab {command}: {e}\n")  # one write: a shared log keeps it whole
            sys.stderr.flush()
        except OSError:  # SIGHUP: the terminal may be gone; the exit status still tells
            pass
        sys.exit(e.exit_code)
    except Exception as e:
        memory = None if deliberate(e) else out_of_memory(e)
        full = not (deliberate(e) or memory) and no_space(e)  # a full disk under a library's writer (a logger, say)
        if not (deliberate(e) or memory or full) or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        if memory:
            message = f"out of memory on the {memory} ({_allocator_said(e)})"
            message += f" {_advice(memory_advice)}" if memory_advice else ""
        elif full:
            message = f"no space left on a disk ({type(e).__name__}: {e}); free space and rerun the same command"
        else:
            message = str(e)
        message = bounded(message)
        hint = "" if isinstance(e, OverrideError) else "\n(set HYDRA_FULL_ERROR=1 for the full traceback)"
        print(f"posenc-lab {command}: error: {message}{hint}", file=sys.stderr)
        sys.exit(1)


def _advice(memory_advice: Callable[[], str]) -> str:
    try:
        return memory_advice()
    except Exception as e:  # noqa: BLE001 - the line about memory is printed whatever its details cost
        return f"(its sizes could not be read: {type(e).__name__})"

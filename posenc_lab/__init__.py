"""posenc-lab: positional-encoding schemes in segment-recurrent (Transformer-XL style) language models.

Importing the package changes nothing in the process; the command-line entry points call
``prefer_passive_openmp()`` before torch loads, ``keep_freed_memory()`` and ``flush_denormals()``.
"""

import ctypes
import os
import sys
from pathlib import Path


def config_dir() -> str:
    """The Hydra config directory: ``conf/`` at the top of a checkout (source tree or editable install),
    shipped inside the package as ``posenc_lab/conf/`` by a wheel (pyproject.toml maps it)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "train.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError(
        f"posenc_lab: no Hydra config directory (train.yaml) in {here / 'conf'} or "
        f"{here.parent / 'conf'}; reinstall the package (pip install .)"
    )


def prefer_passive_openmp() -> None:
    """Ask libgomp to let idle OpenMP threads sleep (``OMP_WAIT_POLICY=PASSIVE``) unless the variable is set.

    On a shared or busy CPU, threads that spin-wait while another process holds the core slow every small
    op down several-fold (measured: 7.5 s vs 1.2 s per training step of the small model on 2 loaded cores);
    sleeping threads cost little otherwise. libgomp reads the variable once, when torch loads it, so every
    entry point that starts a process calls this first (the one place that sets it: ``posenc-lab`` in cli.py,
    ``python -m posenc_lab.bench``, the analysis package's scripts, the tests' conftest); child processes (DDP
    ranks, sweep jobs) inherit it. Override with ``OMP_WAIT_POLICY=ACTIVE``.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


#: glibc's mallopt parameters (malloc.h), and the largest trim threshold mallopt takes (an int)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_TRIM_THRESHOLD_MAX = 2**31 - 1


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse instead of handing it back to the system.
    Returns True where it applied (Linux with glibc), False where it did not or the user chose otherwise
    (``POSENC_LAB_KEEP_FREED_MEMORY=0``, ``MALLOC_MMAP_MAX_`` set to anything but 0, or ``glibc.malloc.mmap_max`` in
    ``GLIBC_TUNABLES``).

    glibc serves every block over 32 MiB with a fresh mmap and unmaps it on free, so each such tensor
    is faulted in again, page by page, on every step: a [B, H, L, N] score tensor of xl or shaw at
    ``base`` sizes (8 x 8 x 256 x 512 fp32 is 32 MiB) costs more to fault in than its GEMM (measured:
    ``zeros`` 17 ms, ``zero_`` on a kept buffer 2 ms). SDPA's fused kernel allocates no such tensor, so
    this mostly lifts the explicit-attention schemes (docs/PERFORMANCE.md). Applied to this process
    now (``mallopt``; blocks larger than a thread arena's 64 MiB heap, requested off the main thread,
    are still mapped) and, through the environment, to the processes it starts (Hydra apps, DDP
    ranks, ablation jobs, data-loader workers). The cost: the resident memory stays near the run's
    peak instead of falling back between steps. Opt out with ``POSENC_LAB_KEEP_FREED_MEMORY=0``: malloc is then
    left as glibc sets it. (``MALLOC_MMAP_MAX_=65536`` is not glibc's default: setting any malloc parameter turns off
    glibc's moving mmap threshold, so every block over 128 KiB is mapped afresh; measured, 2.4x slower steps at
    ``tiny``, benchmarks/openmp_settings.py.)
    """
    user_tunables = "glibc.malloc.mmap_max" in os.environ.get("GLIBC_TUNABLES", "")
    opted_out = os.environ.get("POSENC_LAB_KEEP_FREED_MEMORY", "1") == "0"
    user_set = os.environ.get("MALLOC_MMAP_MAX_", "0") != "0" or user_tunables
    if opted_out or user_set or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the libc this process runs on
    except (OSError, AttributeError):  # a libc without mallopt (musl)
        return False
    try:  # the user's trim threshold, where it is a plain number
        trim = min(int(os.environ.get("MALLOC_TRIM_THRESHOLD_", "")), _TRIM_THRESHOLD_MAX)
    except ValueError:
        trim = _TRIM_THRESHOLD_MAX
    if not (mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, trim)):
        return False
    os.environ["MALLOC_MMAP_MAX_"] = "0"
    os.environ["MALLOC_TRIM_THRESHOLD_"] = str(trim)  # what applies here, for children that never call this
    return True


def flush_denormals() -> bool:
    """Have the CPU treat floats below 1.2e-38 (denormals) as 0 (``torch.set_flush_denormal``; x86 with SSE3).
    Returns whether it applied.

    An attention weight exp(s - max) of a score 87-104 below its row's maximum is a denormal, and arithmetic on
    denormals is microcoded, dozens of times slower: the schemes whose scores spread that far (FoX's decay of
    hundreds over a memory, stick-breaking's log weights) ran their attention 4-5x slower for it on the 2-core
    Xeon (docs/PERFORMANCE.md). The values changed are below 1.2e-38. Called by the entry points before torch
    starts its OpenMP threads, which copy the setting when they are created (a thread that already exists keeps
    its own). Opt out with ``POSENC_LAB_DENORMALS=keep``.
    """
    if os.environ.get("POSENC_LAB_DENORMALS") == "keep":
        return False
    import torch

    return bool(torch.set_flush_denormal(True))

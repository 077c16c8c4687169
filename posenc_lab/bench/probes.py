"""Measurement probes: the device, autocast, timing, peak memory, the matmul peak and the machine's state.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` above what was allocated before; on CPU the
growth of the process's peak resident set (``VmHWM`` of ``/proc/self/status``, reset through
``/proc/self/clear_refs`` before each measurement; ``ru_maxrss`` where that is not possible). RSS counts
pages touched, so it includes allocator caching: a process-level figure, not a tensor-level one.
"""

from __future__ import annotations

import ctypes
import datetime as _dt
import gc
import math
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable

import torch

from .configs import PRECISIONS


def pick_device(device: str | None = None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return torch.autocast(device.type, enabled=False)
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


def _read_status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _release_free_heap() -> None:
    """Return freed heap pages to the OS (glibc malloc_trim), so RSS growth shows new allocations."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Peak memory growth (MiB) over a block: CUDA allocator peak, or the process's peak RSS on CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_mb = float("nan")
        self.method = ""

    def __enter__(self):
        if self.device.type == "cuda":
            _sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            self.method = "cuda max_memory_allocated"
            return self
        _release_free_heap()  # so that memory freed by earlier runs is not silently reused unseen
        self._reset_ok = False
        try:  # Linux >= 4.0: writing 5 resets VmHWM to the current RSS
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._reset_ok = _read_status_kb("VmHWM") is not None
        except OSError:
            pass
        if self._reset_ok:
            self._base = _read_status_kb("VmRSS")
            self.method = "VmHWM - VmRSS at start (clear_refs)"
        else:
            self._base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
            self.method = "ru_maxrss delta"
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            _sync(self.device)
            self.peak_mb = (torch.cuda.max_memory_allocated(self.device) - self._base) / 2**20
        elif self._reset_ok:
            self.peak_mb = max(0.0, (_read_status_kb("VmHWM") - self._base) / 1024)
        else:
            self.peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self._base) / 1024
        return False


def median_time(
    fn: Callable[[], None],
    device: torch.device,
    warmup: int,
    reps: int,
    cpu_times: list | None = None,
    first: list | None = None,
) -> float:
    """Median seconds of one call of ``fn`` over ``reps`` timed calls after ``warmup`` calls.

    ``cpu_times`` (optional) receives the process CPU seconds of each timed call (all threads): on a
    shared machine, wall time includes waiting for the cores; CPU time is the work done. ``first`` (optional)
    receives the wall seconds of the first warm-up call (the one that compiles, with ``torch.compile``)."""
    for i in range(warmup):
        start = time.perf_counter()
        fn()
        if i == 0 and first is not None:
            _sync(device)
            first.append(time.perf_counter() - start)
    _sync(device)
    times = []
    for _ in range(reps):
        cpu, start = time.process_time(), time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
        if cpu_times is not None:
            cpu_times.append(time.process_time() - cpu)
    return statistics.median(times)


def matmul_peak_flops(
    dtype: torch.dtype = torch.float32,
    device: str | torch.device | None = None,
    max_n: int | None = None,
    reps: int = 5,
    min_seconds: float = 0.05,
    cpu_time: bool = False,
) -> float:
    """FLOP/s of a large square matmul of ``dtype`` (best of ``reps``, of torch.mm and F.linear): the
    hardware ceiling for MFU.

    The size doubles from 256 until one product takes ``min_seconds`` or reaches ``max_n`` (2048 on CPU,
    8192 on CUDA), so a dtype without fast kernels on this CPU does not stall the run.
    ``cpu_time``: time by process CPU seconds / threads instead of wall seconds (CPU only): the rate per
    core-second actually given to the process, which other processes on a shared machine do not lower.
    """
    device = pick_device(device if device is None else str(device))
    max_n = max_n or (8192 if device.type == "cuda" else 2048)
    n = 256
    while True:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        torch.mm(a, b)
        _sync(device)
        start = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        if time.perf_counter() - start >= min_seconds or n >= max_n:
            break
        n *= 2
    best = math.inf
    clock, per = (
        (time.process_time, torch.get_num_threads()) if cpu_time and device.type == "cpu" else (time.perf_counter, 1)
    )
    # torch.mm and F.linear can take different kernels (on CPUs without bf16 hardware, bf16 torch.mm
    # is far slower than the oneDNN linear the model uses): the peak is the faster of the two
    for product in (lambda: torch.mm(a, b), lambda: torch.nn.functional.linear(a, b)):
        product()
        for _ in range(reps):
            start = clock()
            product()
            _sync(device)
            best = min(best, (clock() - start) / per)
    return 2 * n**3 / best


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu x{torch.get_num_threads()}"


def environment_line(omp_policy_applies: bool | None = None) -> str:
    """Date, torch, CPU, threads, the OpenMP wait policy, the malloc setting (0: freed memory kept,
    ``posenc_lab.keep_freed_memory``) and the load: what a timing depends on."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (
        f"{_dt.datetime.now().isoformat(timespec='seconds')}  torch {torch.__version__}  "
        f"{platform.processor() or platform.machine()}  threads {torch.get_num_threads()}  "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}"
        f"{' (torch was loaded before it was set: may not apply)' if omp_policy_applies is False else ''}  "
        f"MALLOC_MMAP_MAX_={os.environ.get('MALLOC_MMAP_MAX_', 'unset')}  "
        f"load avg {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )

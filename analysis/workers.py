"""The report's worker processes: the runs' per-token dumps computed in parallel, each kept where the report
reads it.

Small models use two processes of one torch thread better than one process of two. A dump that fails in a
worker (or a worker that dies) is left to the caller, which computes it in its own process and so raises its
error where a sequential report would.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path

import torch

from .runs import Run, analysis_device, load_run, set_device


class DumpWorkers:
    """Worker processes for ``prefetch``, started when first needed inside ``running``; none outside it."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self._pool: ProcessPoolExecutor | None = None
        self._jobs, self._threads = 1, 1

    @contextmanager
    def running(self, jobs: int, threads: int | None) -> Iterator[None]:
        """For the block, ``prefetch`` uses ``jobs`` processes of ``threads`` torch threads each (default: this
        process's threads shared out). Not on a GPU (one device, one process) and not for jobs = 1."""
        if jobs <= 1 or analysis_device() != "cpu":
            yield
            return
        self._jobs, self._threads = jobs, threads or max(1, torch.get_num_threads() // jobs)
        try:
            yield
        except BaseException:  # an interrupt or an error: the workers stop now, not after their dumps
            if self._pool is not None:
                for process in list(getattr(self._pool, "_processes", {}).values()):
                    process.terminate()
            raise
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool, self._jobs = None, 1

    def prefetch(self, compute: Callable, tasks: list[tuple[Run, tuple, Path]], what: str) -> set[str]:
        """``compute(run, *args, path)`` for every (run, args, path) of ``tasks`` in the workers, started in that
        order; the names of the runs computed (none without workers)."""
        if self._jobs <= 1 or len(tasks) < 2:
            return set()
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self._jobs, multiprocessing.get_context("spawn"), _worker_init, (self._threads, analysis_device())
            )
        try:
            futures = {
                self._pool.submit(_dump_in_worker, compute, str(r.path), args, str(path)): r for r, args, path in tasks
            }
        except BrokenProcessPool:  # a worker died earlier (e.g. out of memory): the rest in this process
            self.log("  the report's worker processes stopped; computing the rest in this process")
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool, self._jobs = None, 1
            return set()
        done: set[str] = set()
        for i, future in enumerate(as_completed(futures), 1):
            run = futures[future]
            try:
                messages, seconds = future.result()
            except Exception as e:  # noqa: BLE001 - computed again by the caller, where its error is raised
                self.log(f"  {what}: {run.label} failed in a worker ({type(e).__name__}: {e}); computing it here")
                continue
            for m in messages:
                self.log(m)
            done.add(run.name)
            self.log(f"  {what} [{i}/{len(tasks)}] {run.label} ({seconds:.0f} s, {self._jobs} at a time)")
        return done


def _worker_init(threads: int, device: str) -> None:
    torch.set_num_threads(threads)
    set_device(device)


def _dump_in_worker(compute: Callable, run_path: str, args: tuple, path: str) -> tuple[list[str], float]:
    """In a worker: ``compute`` one run's dump, kept where the report reads it; (its log lines, seconds)."""
    messages: list[str] = []
    t0 = time.perf_counter()
    compute(load_run(run_path), *args, Path(path), messages.append)
    return messages, time.perf_counter() - t0

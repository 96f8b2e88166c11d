"""Checkpoints written while training goes on: megatron-core's asynchronous distributed
checkpointing. Training waits only while the tensors are copied to host memory kept from save
to save (pipeline.training.host_staging) and a writer process is forked; the writer writes
them and hashes what it wrote; the checkpoint is completed (COMPLETE.json, renamed,
latest.txt, best.json) at the first step boundary after every rank's writer is done. At most
one save is in flight: the next waits for it, as do the end of the run and a stop for a
signal. A kill while one is in flight leaves its `.partial` folder, which is never loaded: the
run resumes from the checkpoint before it.

A save that runs out of space on every rank is skipped with a warning and training goes on:
the next interval tries again, and resilience.max_failed_saves in a row stop the run. The last save
of the run, or of a stop, is never skipped: nothing would come after it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from pipeline.core import files, log
from pipeline.core.errors import OutOfSpace
from pipeline.runtime import distributed
from pipeline.runtime.device import cuda_calls_on_cpu
from pipeline.training import checkpoint
from pipeline.training.host_staging import HostStaging


@dataclass
class _InFlight:
    step: int
    partial: Path
    state: dict
    started: float  # time.perf_counter() when the save began
    blocked_s: float  # how long training has waited for it so far


def _write_then_hash(write, partial_folder: Path, rank: int, *args, **kwargs) -> None:
    """In the forked writer: megatron-core's write, then the digests of this rank's files."""
    write(*args, **kwargs)
    checkpoint.record_digests(partial_folder, rank)


class CheckpointSaver:
    """Saves the run's checkpoints, in the background when `asynchronous`. Collective: every
    rank makes the same calls at the same steps. Each finished save is reported as a record
    for metrics.jsonl: the step, how long training was blocked, how long the save took."""

    def __init__(
        self, root: Path, backend, keep_last: int, asynchronous: bool, max_failed: int
    ) -> None:
        self.root, self.backend, self.keep_last = root, backend, keep_last
        self.max_failed, self.failed_in_a_row = max_failed, 0
        self.on_cpu = backend.device.type == "cpu"
        self.queue = None
        if asynchronous:
            from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

            self.queue = AsyncCallsQueue()
        self.staging = HostStaging()
        self.in_flight: _InFlight | None = None

    def reserve(self, nbytes: int) -> None:
        """Pin host memory for the saves' copies now, in the background (GPU runs)."""
        if self.queue is not None and not self.on_cpu:
            self.staging.reserve(nbytes)

    def close(self) -> None:
        """Give the host memory back (after the last save is complete)."""
        self.staging.close()

    def _cuda_calls(self) -> contextlib.AbstractContextManager:
        # megatron-core's scheduling waits for CUDA copies and reduces a flag on the CUDA device
        return cuda_calls_on_cpu() if self.on_cpu else contextlib.nullcontext()

    def save(self, step: int, state: dict, chunks, optimizer, last: bool = False) -> dict | None:
        """Start a save of `step` (complete it now unless asynchronous). Returns the record of
        a save that finished meanwhile: the one before, waited for, or this one. `last`: the
        run's last save, never skipped."""
        done = self.wait()  # at most one in flight
        error = None
        try:
            record = self._start(step, state, chunks, optimizer)
        except OutOfSpace as e:
            error, record = e, None
        if self._failed_everywhere(error):
            return self._skipped(error, step, last) or done
        return self._succeeded(record) or done

    def _start(self, step: int, state: dict, chunks, optimizer) -> dict | None:
        started = time.perf_counter()
        if self.queue is None:  # not asynchronous
            checkpoint.save(self.root, step, state, self.backend, chunks, optimizer, self.keep_last)
            took = time.perf_counter() - started
            return _record(step, blocked_s=took, total_s=took)
        partial_folder = checkpoint.begin(self.root, step, chunks)
        try:
            with files.reporting_space(f"checkpoint {partial_folder}", probe=partial_folder):
                request = self.backend.save(partial_folder, chunks, optimizer, asynchronous=True)
                checkpoint.write_small_files(partial_folder, state)
                rank = torch.distributed.get_rank()
                if request.async_fn is None:  # nothing of the tensors falls to this rank
                    checkpoint.record_digests(partial_folder, rank)
                else:
                    hashing = partial(_write_then_hash, request.async_fn, partial_folder, rank)
                    # the writer's second argument: the buckets it writes, copied to host memory
                    staging = partial(self.staging.preload, request.async_fn_args[1])
                    request = request._replace(async_fn=hashing, preload_fn=staging)
                with self._cuda_calls():
                    self.queue.schedule_async_request(request)
        except BaseException:
            checkpoint.abandon(partial_folder)
            raise
        blocked = time.perf_counter() - started
        self.in_flight = _InFlight(step, partial_folder, state, started, blocked)
        return None

    def poll(self) -> dict | None:
        """At a step boundary: complete the save in flight if every rank's writer is done."""
        return self._finish(blocking=False) if self.in_flight else None

    def wait(self, last: bool = False) -> dict | None:
        """Complete the save in flight, waiting for its writers (the next save; `last`: the end
        of the run, a stop)."""
        return self._finish(blocking=True, last=last) if self.in_flight else None

    def _finish(self, blocking: bool, last: bool = False) -> dict | None:
        flight = self.in_flight
        waited = time.perf_counter()
        error = None
        try:  # megatron-core's finalize agrees across ranks on whether the writers are done
            space = files.reporting_space(f"checkpoint {flight.partial}", probe=flight.partial)
            with space, self._cuda_calls():
                if not self.queue.maybe_finalize_async_calls(blocking=blocking):
                    return None
        except OutOfSpace as e:
            error = e
        if self._failed_everywhere(error):
            self.in_flight = None
            checkpoint.abandon(flight.partial)
            return self._skipped(error, flight.step, last)
        try:
            with files.reporting_space(f"checkpoint {flight.partial}", probe=flight.partial):
                checkpoint.complete(
                    self.root, flight.partial, flight.step, flight.state, self.keep_last
                )
        except BaseException:
            self.in_flight = None
            checkpoint.abandon(flight.partial)
            raise
        self.in_flight = None
        blocked = flight.blocked_s + time.perf_counter() - waited
        total = time.perf_counter() - flight.started
        return self._succeeded(_record(flight.step, blocked_s=blocked, total_s=total))

    def _failed_everywhere(self, error: OutOfSpace | None) -> bool:
        """Collective: whether the save failed for space on every rank (then it is skipped); on
        some ranks only, it stops the run as before (the ranks hold different saves)."""
        device = self.backend.device
        if not distributed.any_rank(error is not None, device):
            return False
        if distributed.any_rank(error is None, device):
            raise error or OutOfSpace("a checkpoint save ran out of space on another rank")
        return True

    def _skipped(self, error: OutOfSpace, step: int, last: bool) -> None:
        self.failed_in_a_row += 1
        n, most = self.failed_in_a_row, self.max_failed
        if last or n >= most:
            why = "the run's last save" if last else f"resilience.max_failed_saves={most} in a row"
            raise OutOfSpace(f"{error} ({why})")
        log.get().warning(
            f"warning: {error.what}; the save of step {step} is skipped, training goes on and the "
            f"next save tries again ({n} in a row, resilience.max_failed_saves={most})"
        )

    def _succeeded(self, record: dict | None) -> dict | None:
        if record is not None:
            self.failed_in_a_row = 0
        return record


def _record(step: int, blocked_s: float, total_s: float) -> dict[str, Any]:
    return {"step": step, "checkpoint_blocked_s": blocked_s, "checkpoint_total_s": total_s}

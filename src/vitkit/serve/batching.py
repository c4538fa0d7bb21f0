"""Dynamic batching: concurrent requests' images coalesce into one batch for one executor thread.

A request's images, already decoded and checked, are queued as jobs. One collector task on the event
loop takes the oldest job and waits until ``max_batch`` jobs are there or ``max_wait_ms`` have passed
since that job arrived - but only while other requests are on their way (being read or decoded, see
:meth:`Batcher.expect`): a lone request on an idle server runs at once. It then hands the batch to the one
inference thread (which owns the cores: torch's intra-op threads, or the runtime's) and waits for it, while
new jobs queue up for the next batch. Jobs
whose request has gone (the client disconnected: their future is cancelled) are dropped before the
batch runs. The queue is bounded: :meth:`Batcher.submit` raises :class:`QueueFull` rather than queue
past ``max_queue`` images.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence

from ..errors import Fault

log = logging.getLogger("vitkit.serve")


class QueueFull(Fault):
    """The queue is full: 503 ``busy`` with ``Retry-After`` (``retry_after`` seconds)."""

    def __init__(self, retry_after: int, detail: str):
        super().__init__(503, "busy", detail, {"Retry-After": str(retry_after)})
        self.retry_after = retry_after


@dataclass
class Job:
    item: Any  # what the step function takes for this image
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


@dataclass
class BatchInfo:
    id: int
    size: int
    compute_s: float


@dataclass
class Done:
    """One image's result: the step's output, the batch it ran in, and the time it waited in the queue."""

    output: Any
    batch: BatchInfo
    queue_s: float


class Batcher:
    """``step(items) -> outputs`` (one per item, same order) runs on one thread, in batches of at most
    ``max_batch`` formed within ``max_wait_ms`` of the oldest waiting job."""

    def __init__(self, step: Callable[[List[Any]], Sequence[Any]], *, max_batch: int = 16,
                 max_wait_ms: float = 5.0, max_queue: int = 256,
                 on_batch: Optional[Callable[[BatchInfo], None]] = None):
        if max_batch < 1 or max_queue < 1 or max_wait_ms < 0:
            from ..errors import ConfigError
            raise ConfigError("max_batch and max_queue must be at least 1, max_wait_ms at least 0")
        self.step = step
        self.max_batch, self.max_wait, self.max_queue = max_batch, max_wait_ms / 1000.0, max_queue
        self.on_batch = on_batch
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="vitkit-infer")
        self._queue: "asyncio.Queue[Job]" = asyncio.Queue()
        self._task: Optional[asyncio.Task] = None
        self._ids = itertools.count(1)
        self._wake = asyncio.Event()
        self.incoming = 0  # requests being read or decoded: images that may join the next batch
        self.pending = 0  # jobs queued, not yet in a batch
        self.dropped = 0
        self.last_compute_s = 0.0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="vitkit-batcher")

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the inference thread (warm-up, engine selection): nothing else runs meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn)

    def expect(self, n: int = 1) -> None:
        """``n`` more requests are on their way (+1 when one starts, -1 when it has submitted or failed)."""
        self.incoming = max(0, self.incoming + n)
        self._wake.set()

    def submit(self, items: Sequence[Any]) -> List[asyncio.Future]:
        """Queue the items (one request's images, all or none); futures resolve to :class:`Done`."""
        if self.pending + len(items) > self.max_queue:
            batches = math.ceil((self.pending + len(items)) / self.max_batch)
            retry = max(1, math.ceil(batches * max(self.last_compute_s, 0.01) + self.max_wait))
            raise QueueFull(retry, f"the server is busy: {self.pending} images are waiting (at most "
                            f"{self.max_queue}); retry in about {retry} s")
        loop = asyncio.get_running_loop()
        futures = []
        for item in items:
            fut = loop.create_future()
            self._queue.put_nowait(Job(item, fut))
            futures.append(fut)
        self.pending += len(items)
        self._wake.set()
        return futures

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = await self._queue.get()
            batch = [first]
            deadline = first.enqueued + self.max_wait
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                    continue
                except asyncio.QueueEmpty:
                    pass
                wait = deadline - time.perf_counter()
                if wait <= 0 or self.incoming <= 0:  # the time is up, or nobody else is coming
                    break
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), wait)
                except asyncio.TimeoutError:
                    pass
            self.pending -= len(batch)
            live = [j for j in batch if not j.future.done()]  # a cancelled future: the client has gone
            if len(live) < len(batch):
                self.dropped += len(batch) - len(live)
                log.info("dropped %d image(s) whose client had gone", len(batch) - len(live))
            if not live:
                continue
            started = time.perf_counter()
            try:
                outputs = await loop.run_in_executor(self.executor, self.step, [j.item for j in live])
            except Exception as err:  # noqa: BLE001 - fails this batch's requests, not the server
                log.exception("inference failed for a batch of %d", len(live))
                for j in live:
                    if not j.future.done():
                        j.future.set_exception(err)
                continue
            took = time.perf_counter() - started
            self.last_compute_s = took
            info = BatchInfo(next(self._ids), len(live), took)
            if self.on_batch is not None:
                self.on_batch(info)
            for j, out in zip(live, outputs):
                if not j.future.done():
                    j.future.set_result(Done(out, info, started - j.enqueued))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
            self._task = None
        self.executor.shutdown(wait=True)

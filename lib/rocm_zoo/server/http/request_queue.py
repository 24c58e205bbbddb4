"""Requests as the scheduler sees them: admitted into a bounded queue of their class, run in a worker thread, given up
when their deadline passes or their client hangs up.

The HTTP event loop only waits: every request's work runs in a thread of its own, so `/info`, datastore listings and
health answer while any inference runs. How many requests of a class run at once (their CPU parts overlap; their
device parts take turns in `rocm_zoo.engine.scheduler`) and how many may wait is fixed per class; one more waiter
gets a 503 with Retry-After. A request past `request_timeout_s` gets a 504 and a request whose client disconnected is
dropped: both stop at their next turn on the device, or leave the queue if they never got one.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from starlette.requests import Request

from rocm_zoo.engine.scheduler import FairQueue, Priority, Work, devices_info, request_in_progress, working_as
from rocm_zoo.errors import DeadlineExceeded, QueueFull

logger = logging.getLogger(__name__)

# How often a waiting handler looks at its client's connection.
DISCONNECT_POLL_S = 0.1


class RequestService:
    """One per server: the request queues of each class and the threads that run them."""

    def __init__(self, timeout_s: float, running: dict[Priority, int], waiting: dict[Priority, int]):
        self.timeout_s = timeout_s
        self.queues = {p: FairQueue(f"{p.name.lower()} requests", slots=running[p], max_waiting=waiting)
                       for p in running}
        self._executor = ThreadPoolExecutor(max_workers=sum(running.values()) + sum(waiting.values()) + 4,
                                            thread_name_prefix="rocm_zoo-request")
        self.dropped = {"deadline": 0, "disconnected": 0, "queue_full": 0}

    def running(self) -> bool:
        """Is any request running or waiting? (A batch starts its next study only when none is.)"""
        return any(q.holders or q.waiting() for q in self.queues.values())

    def work(self, priority: Priority, client: str, what: str) -> Work:
        return Work(priority, client, deadline=time.monotonic() + self.timeout_s, what=what)

    async def run(self, request: Request, work: Work, fn: Callable[..., Any], *args: Any,
                  on_abandon: Callable[[], None] = lambda: None) -> Any:
        """`fn(*args)` in a worker thread as `work`; its result, or DeadlineExceeded / QueueFull. A client that hangs up
        gets nothing (its work is cancelled). `on_abandon` runs once the work ends after its answer was given up."""
        queue = self.queues[work.priority]
        limit = queue.max_waiting.get(work.priority)
        if limit is not None and queue.waiting(work.priority) >= limit:  # the authoritative check is in acquire
            self.dropped["queue_full"] += 1
            retry = queue.retry_after_s(work.priority)
            raise QueueFull(f"{work.what}: the queue of {work.priority.name.lower()} requests is full ({limit} "
                            f"waiting); try again in {retry} s", retry_after_s=retry)
        context = contextvars.copy_context()
        future = asyncio.get_running_loop().run_in_executor(self._executor, context.run, self._call, queue, work, fn,
                                                            args)
        try:
            return await self._wait(request, work, future)
        except BaseException:
            if not future.done():
                work.cancelled.set()
                future.add_done_callback(lambda f: _ended_unheard(f, on_abandon))
            raise

    @staticmethod
    def _call(queue: FairQueue, work: Work, fn: Callable[..., Any], args: tuple) -> Any:
        with working_as(work), request_in_progress(), queue.held(work):
            return fn(*args)

    async def _wait(self, request: Request, work: Work, future: asyncio.Future) -> Any:
        while True:
            left = work.deadline - time.monotonic()
            if left <= 0:
                self.dropped["deadline"] += 1
                raise DeadlineExceeded(f"{work.what} did not finish within request_timeout_s "
                                       f"({self.timeout_s:g} s); its remaining work was dropped")
            done, _ = await asyncio.wait({future}, timeout=min(DISCONNECT_POLL_S, left))
            if done:
                return future.result()
            if await request.is_disconnected():
                self.dropped["disconnected"] += 1
                logger.info("%s: client %s disconnected; its work is dropped", work.what, work.client)
                work.cancelled.set()
                raise ClientGone()

    def info(self) -> dict[str, Any]:
        return {
            "timeout_s": self.timeout_s,
            "queues": {p.name.lower(): {"running": q.holders, "running_max": q.slots, "waiting": q.waiting(p),
                                        "waiting_max": q.max_waiting.get(p), "served": q.served[p]}
                       for p, q in self.queues.items()},
            "dropped": dict(self.dropped),
            "devices": devices_info(),
        }


def _ended_unheard(future: asyncio.Future, on_abandon: Callable[[], None]) -> None:
    """Work whose answer nobody waits for any more: its outcome (usually WorkCancelled) is read so asyncio does not
    report it as never retrieved, and what it left behind is cleaned up."""
    if not future.cancelled() and future.exception() is not None:
        logger.debug("abandoned work ended with %r", future.exception())
    on_abandon()


class ClientGone(Exception):
    """The client closed its connection while its request waited or ran; nobody is left to answer."""

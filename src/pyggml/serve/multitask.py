"""Several tasks for one request: ``n`` > 1 choices, or /completion's several prompts.

llama-server posts one task per output (a prompt's ``n_cmpl`` children, times the prompts) and
answers once all are done; a stream interleaves their chunks as they come, each tagged with its
``index``. Here every output is a :class:`Task` of its own, decoded in the engine's shared batch; the
helpers below wait on all their queues at once and cancel all of them when the client goes.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from .engine import DoneEvent, Engine, ErrorEvent, Event, Task, TaskParams, TokenEvent
from .errors import APIError


@dataclasses.dataclass
class Outcome:
    """One task's result: its DoneEvent and the per-token probabilities it sent."""

    done: DoneEvent
    probs: list[dict[str, Any]]


def check_n(n: int, n_slots: int, name: str = "n") -> None:
    """llama-server's hard limit on ``n_cmpl`` (alias ``n``): 1 to the number of slots."""
    if not 1 <= n <= n_slots:
        raise APIError(f"'{name}' must be between 1 and {n_slots} (this server's slots), got {n}")


def submit_all(engine: Engine, prompts: Sequence[list[int]], params: Sequence[TaskParams]) -> list[Task]:
    """One task per (prompt, params) pair, all queued or none (a refused one cancels those already queued)."""
    tasks: list[Task] = []
    try:
        for tokens, p in zip(prompts, params, strict=True):
            task = Task(tokens, p)
            engine.submit(task)
            tasks.append(task)
    except BaseException:
        for t in tasks:
            engine.cancel(t)
        raise
    return tasks


async def merged(tasks: Sequence[Task]) -> AsyncIterator[tuple[int, Event]]:
    """Each task's events as they arrive, tagged with the task's position; a task's stream ends at its
    DoneEvent or ErrorEvent, the whole at the last task's."""
    waiting: dict[asyncio.Future[Event], int] = {asyncio.ensure_future(t.queue.get()): i for i, t in enumerate(tasks)}
    try:
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: waiting[f]):
                i = waiting.pop(fut)
                ev = fut.result()
                if not isinstance(ev, DoneEvent | ErrorEvent):
                    waiting[asyncio.ensure_future(tasks[i].queue.get())] = i
                yield i, ev
    finally:
        for fut in waiting:
            fut.cancel()


async def collect(tasks: Sequence[Task], keep_probs: bool) -> list[Outcome]:
    """Wait for every task; the first error is raised (the caller cancels the others)."""
    probs: list[list[dict[str, Any]]] = [[] for _ in tasks]
    out: list[Outcome | None] = [None] * len(tasks)
    async for i, ev in merged(tasks):
        if isinstance(ev, ErrorEvent):
            raise ev.error
        if isinstance(ev, TokenEvent):
            if keep_probs and ev.probs is not None:
                probs[i].append(ev.probs)
        else:
            out[i] = Outcome(ev, probs[i])
    return [o for o in out if o is not None]


def cancel_all(engine: Engine, tasks: Sequence[Task]) -> Callable[[], None]:
    def cancel() -> None:
        for t in tasks:
            engine.cancel(t)

    return cancel

"""ggml-cpu's threading: persistent workers, one barrier per node, work split by ``(ith, nth)``.

ggml runs a graph with a team of threads that all walk the node list; each calls the node's kernel
with its index ``ith`` of ``nth`` (the kernel takes its share of rows), then all meet at a barrier.
This module does the same with Python threads that spend their life inside numba code:

* The **control block** is a small int64 array shared by all threads: barrier counters, the
  work-chunk counter kernels hand out rows with, the current command, and error/abort words.
  Hot words sit on cache lines of their own.
* :func:`run_nodes` walks nodes ``[n0, n1)`` of a plan (a table of kernel addresses and node
  records, see plan.py), calling each kernel and then :func:`barrier`. The caller is thread 0.
* **Workers** (``nth - 1`` Python threads) sit in :func:`worker_loop`, a compiled spin-wait on the
  command sequence number, so starting a graph costs a store, not a thread wake-up. A worker can
  also be asked to run a Python callable (``run_python``): the numba kernels and BLAS calls such
  callables make release the GIL, so both threads compute at once.
* **Waiting backs off** as ggml's threadpool (and the OpenMP runtime llama.cpp builds with) does:
  a waiting thread spins with the CPU's pause hint for a bounded number of polls, then sleeps on a
  futex until the thread it waits for wakes it (elsewhere than Linux: it yields the core). A
  barrier spins up to ``BARRIER_SPINS`` polls, an idle worker up to ``IDLE_SPINS``, budgets that
  shrink while waits keep outlasting them (see :func:`barrier`). Spinning costs nothing
  while every thread has a core of its own, but on a core shared with another busy process a
  spinning thread burns the time slices it gets, and is then descheduled while it holds work the
  others wait for. A thread that sleeps instead gives the core to the other process and, woken,
  is scheduled ahead of it (it has used less CPU time), so a busy core slows a graph down no more
  than it slows one thread down.

There is one pool per process (:func:`get_pool`). A graph computed while another thread holds the
pool runs on its caller alone (``nth = 1``), as it would have with one thread.
"""

from __future__ import annotations

import _signal  # getsignal without signal.getsignal's enum conversion (2 us a call, a raised ValueError inside)
import os
import signal
import threading
from collections.abc import Callable

import numba
import numpy as np

from .native import (
    HAVE_FUTEX,
    atomic_add,
    atomic_load,
    atomic_store,
    call_kernel,
    cpu_relax,
    futex_wait,
    futex_wake,
    i64p,
    sched_yield,
    u8p,
)

# ------------------------------------------------------------------------------ control block
#: int64 word offsets; each line of 8 words (64 bytes) holds one hot word
C_ARRIVED = 0  # barrier: threads arrived at the current barrier
C_PASSED = 8  # barrier: generation, bumped by the last thread to arrive
C_CHUNK = 16  # next work chunk (kernels that hand out chunks dynamically, as ggml's current_chunk)
C_SEQ = 24  # command sequence number; workers act when it changes
C_ERR = 32  # a kernel's error code (0: none); C_ERR + 1: the node index that raised it
C_ABORT = 40  # set by thread 0 to stop the others
#: the command (written by thread 0 before bumping C_SEQ)
C_KIND = 48
C_FNS = 49  # address of the plan's int64[n] kernel addresses
C_RECS = 50  # address of the plan's node records
C_N0 = 51
C_N1 = 52
C_NTH = 53
C_WDATA = 54  # address of the shared work buffer (activation quantization etc.)
C_WSIZE = 55
#: read-mostly settings: polls before a barrier wait sleeps, and before an idle worker sleeps
C_SPIN = 56
C_IDLE_SPIN = 57
#: the command's barrier table: address of the plan's uint8[n], 0 after a node the next one need not wait for
#: (0: a barrier after every node)
C_BARS = 58
#: threads asleep in a barrier, and idle workers asleep on C_SEQ: a thread that releases them makes
#: the futex_wake system call only when one of these is non-zero (written only by sleepers)
C_SLEEPERS = 64
C_IDLERS = 65
#: times a thread went to sleep in a wait, for diagnostics and tests (written only by sleepers)
C_NAPS = 66
#: the barrier's current spin budget, between MIN_SPINS and C_SPIN (see barrier); written only when it moves
C_SPIN_NOW = 67
#: per-worker words from here on: state and last seen sequence number, one line per worker
C_WORKERS = 72
W_STATE = 0
W_SEEN = 1
MAX_THREADS = 64
CTRL_WORDS = C_WORKERS + 8 * MAX_THREADS

#: command kinds
K_NODES = 1
K_PYTHON = 2
K_EXIT = 3
#: worker states
S_SPINNING = 0
S_SLEEPING = 1
#: worker_loop return codes
R_IDLE = 0
R_EXIT = 1
R_PYTHON = 2

#: idle polls (each a pause, ~10-40 ns) before a worker sleeps: about a millisecond, longer than
#: the Python work between two decode steps, so back-to-back graphs rarely wait for a wake-up
IDLE_SPINS = 1 << 16
#: barrier polls before the waiting thread sleeps: tens of microseconds, several times the usual
#: imbalance between threads at a node's end, so an uncontended graph almost never sleeps
BARRIER_SPINS = 1 << 11
#: the least the adaptive budget shrinks to (when the configured C_SPIN is not below it)
MIN_SPINS = 1 << 8
#: bytes of one node record (plan.NODE_WORDS int64 words); kept here so run_nodes needs no import
NODE_BYTES = 64 * 8


@numba.njit(nogil=True, cache=True)
def barrier(ctrl: int, nth: int) -> None:  # pragma: no cover - compiled
    """Wait until all ``nth`` threads have arrived (ggml_barrier: arrivals counter + generation).

    The last thread to arrive bumps the generation and wakes the threads that went to sleep; the
    others spin up to C_SPIN_NOW polls on the generation, then sleep on it (see :func:`wait_change`).

    The budget adapts: a wait that had to sleep halves it (down to MIN_SPINS), one that ended while
    spinning doubles it (up to C_SPIN), and each command starts with all of it (seq_end). Unloaded,
    nearly every wait ends within a few hundred polls (a Gemma 3 decode step: under one sleep in its
    580 barriers), so the budget stays whole. With a thread's core shared by a busy process most
    waits outlast any spin (the thread waited for is descheduled), and spinning them out only burns
    the CPU share the scheduler would otherwise give the waiting thread's own work; the budget then
    falls and the threads sleep almost at once.
    """
    if nth <= 1:
        return
    gen = atomic_load(ctrl + 8 * C_PASSED)
    if atomic_add(ctrl + 8 * C_ARRIVED, 1) == nth - 1:
        atomic_store(ctrl + 8 * C_ARRIVED, 0)
        atomic_add(ctrl + 8 * C_PASSED, 1)
        if HAVE_FUTEX and atomic_load(ctrl + 8 * C_SLEEPERS) != 0:
            futex_wake(ctrl + 8 * C_PASSED)
        return
    budget = atomic_load(ctrl + 8 * C_SPIN_NOW)
    if wait_change(ctrl, C_PASSED, gen, budget, C_SLEEPERS):
        if budget > MIN_SPINS:
            atomic_store(ctrl + 8 * C_SPIN_NOW, max(budget >> 1, MIN_SPINS))
    else:
        top = atomic_load(ctrl + 8 * C_SPIN)
        if budget < top:
            atomic_store(ctrl + 8 * C_SPIN_NOW, min(max(budget << 1, MIN_SPINS), top))


@numba.njit(nogil=True, cache=True)
def wait_change(ctrl: int, word: int, old: int, spins: int, sleepers: int) -> bool:  # pragma: no cover
    """Return once control word ``word`` is no longer ``old``: poll it ``spins`` times, then sleep.
    True when the wait slept (or yielded).

    Sleeping is a futex wait on the word, announced in the ``sleepers`` word first. The thread
    that changes the word reads that counter after its change (both sequentially consistent), so
    either it sees the sleeper and wakes it, or the sleeper's futex call sees the new value and
    returns at once: no wake-up is lost. Without futexes the wait yields the core between polls.
    """
    addr = ctrl + 8 * word
    n = 0
    slept = False
    while atomic_load(addr) == old:
        if n < spins:
            cpu_relax()
            n += 1
            continue
        slept = True
        if HAVE_FUTEX:
            atomic_add(ctrl + 8 * sleepers, 1)
            if atomic_load(addr) == old:
                atomic_add(ctrl + 8 * C_NAPS, 1)
                futex_wait(addr, old)
            atomic_add(ctrl + 8 * sleepers, -1)
        else:
            sched_yield()
    return slept


@numba.njit(nogil=True, cache=True)
def idle_budget(ctrl: int) -> int:  # pragma: no cover - compiled
    """Polls an idle worker spins before it sleeps: C_IDLE_SPIN, scaled down as the barrier's budget is."""
    top = atomic_load(ctrl + 8 * C_SPIN)
    idle = atomic_load(ctrl + 8 * C_IDLE_SPIN)
    return idle if top <= 0 else idle * atomic_load(ctrl + 8 * C_SPIN_NOW) // top


@numba.njit(nogil=True, cache=True)
def run_nodes(ctrl: int, ith: int) -> int:  # pragma: no cover - compiled
    """Run the current command's nodes as thread ``ith``; returns the failing node's index or -1.

    After each node all threads meet at the barrier, but after a node that the barrier table (C_BARS) says
    the next one does not depend on (plan.py's independent runs), and never after the last; a kernel that
    met bad data sets C_ERR, and every thread sees it after the next barrier and stops (thread 0 records
    the node it stopped after: the one that failed or a later one of its run).
    """
    c = numba.carray(i64p(ctrl), CTRL_WORDS)
    n0, n1, nth = c[C_N0], c[C_N1], c[C_NTH]
    fns = numba.carray(i64p(c[C_FNS]), n1)
    recs = c[C_RECS]
    bars = c[C_BARS]
    for i in range(n0, n1):
        call_kernel(fns[i], recs + i * NODE_BYTES, ith, nth, ctrl)
        if bars != 0 and i < n1 - 1 and u8p(bars)[i] == 0:
            continue
        barrier(ctrl, nth)
        if atomic_load(ctrl + 8 * C_ERR) != 0:
            if ith == 0:
                atomic_store(ctrl + 8 * (C_ERR + 1), i)
            barrier(ctrl, nth)  # nobody leaves before the index is written
            return i
    return -1


@numba.njit(nogil=True, cache=True)
def worker_loop(ctrl: int, ith: int) -> int:  # pragma: no cover - compiled
    """A worker's life between commands: poll C_SEQ, run node commands, hand Python ones back.

    C_SEQ is a sequence lock: odd while thread 0 writes a command, even once it is complete. A
    worker acts on an even value it has not seen, and only if the value did not move while it read
    the command (a command this worker takes no part in may be replaced at any moment). After
    :func:`idle_budget` idle polls it sleeps on C_SEQ until :func:`seq_end` wakes it (a futex wait, in
    here); without futexes it returns R_IDLE and sleeps in Python on an Event instead.
    """
    me = ctrl + 8 * (C_WORKERS + 8 * (ith - 1))
    atomic_store(me + 8 * W_STATE, S_SPINNING)
    seen = atomic_load(me + 8 * W_SEEN)
    spins = 0
    budget = idle_budget(ctrl)
    while True:
        seq = atomic_load(ctrl + 8 * C_SEQ)
        if seq != seen and seq % 2 == 0:
            kind = atomic_load(ctrl + 8 * C_KIND)
            nth = atomic_load(ctrl + 8 * C_NTH)
            if atomic_load(ctrl + 8 * C_SEQ) != seq:
                continue
            seen = seq
            atomic_store(me + 8 * W_SEEN, seq)
            spins = 0
            budget = idle_budget(ctrl)
            if kind == K_EXIT:
                return R_EXIT
            if ith >= nth:
                continue
            if kind == K_PYTHON:
                return R_PYTHON
            run_nodes(ctrl, ith)
            continue
        if spins < budget:
            cpu_relax()
            spins += 1
            continue
        if HAVE_FUTEX:
            wait_change(ctrl, C_SEQ, seq, 0, C_IDLERS)
            continue
        atomic_store(me + 8 * W_STATE, S_SLEEPING)
        if atomic_load(ctrl + 8 * C_SEQ) != seen:  # a command raced in: take it
            atomic_store(me + 8 * W_STATE, S_SPINNING)
            spins = 0
            continue
        return R_IDLE


@numba.njit(nogil=True, cache=True)
def seq_begin(ctrl: int) -> None:  # pragma: no cover - compiled
    """Thread 0 starts writing a command: C_SEQ becomes odd."""
    atomic_add(ctrl + 8 * C_SEQ, 1)


@numba.njit(nogil=True, cache=True)
def seq_end(ctrl: int) -> None:  # pragma: no cover - compiled
    """The command is written: clear the error words, give the barrier its full spin budget back
    (each graph starts from C_SPIN, so a budget that shrank in a loaded moment does not stay small
    once the load is gone), make C_SEQ even (workers may act), and wake the workers asleep on C_SEQ."""
    atomic_store(ctrl + 8 * C_ERR, 0)
    atomic_store(ctrl + 8 * C_ABORT, 0)
    atomic_store(ctrl + 8 * C_SPIN_NOW, atomic_load(ctrl + 8 * C_SPIN))
    atomic_add(ctrl + 8 * C_SEQ, 1)
    if HAVE_FUTEX and atomic_load(ctrl + 8 * C_IDLERS) != 0:
        futex_wake(ctrl + 8 * C_SEQ)


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def new_ctrl() -> np.ndarray:
    """A zeroed control block, aligned to a cache line."""
    raw = np.zeros(CTRL_WORDS + 8, dtype=np.int64)
    skip = (-raw.ctypes.data % 64) // 8
    return raw[skip : skip + CTRL_WORDS]


class ThreadPool:
    """Persistent workers that run plan segments (compiled) and Python chunks for one owner at a time."""

    def __init__(self) -> None:
        self.ctrl = new_ctrl()
        self.addr = int(self.ctrl.ctypes.data)
        self._workers: list[threading.Thread] = []
        self._wake: list[threading.Event] = []
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        self._task: Callable[[], None] | None = None
        self.set_spins(BARRIER_SPINS, IDLE_SPINS)

    def set_spins(self, barrier: int, idle: int) -> None:
        """Polls before a barrier wait sleeps, and before an idle worker sleeps (0: sleep at once).

        Read by the threads at each wait, so a change applies to the next one."""
        self.ctrl[C_SPIN] = self.ctrl[C_SPIN_NOW] = max(0, int(barrier))
        self.ctrl[C_IDLE_SPIN] = max(0, int(idle))

    def naps(self) -> int:
        """How many times a thread of this pool has gone to sleep in a wait so far."""
        return int(self.ctrl[C_NAPS])

    # ------------------------------------------------------------------ ownership
    def acquire(self) -> bool:
        """Take the pool for this thread (re-entrant); False when another thread holds it."""
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return True
        if not self._lock.acquire(blocking=False):
            return False
        self._owner, self._depth = me, 1
        return True

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._lock.release()

    def owned(self) -> bool:
        return self._owner == threading.get_ident()

    # ------------------------------------------------------------------ workers
    def ensure(self, nth: int) -> int:
        """Have ``nth - 1`` workers running (capped at MAX_THREADS); returns the usable nth."""
        nth = max(1, min(nth, MAX_THREADS))
        while len(self._workers) < nth - 1:
            w = len(self._workers)
            self.ctrl[C_WORKERS + 8 * w + W_STATE] = S_SLEEPING  # it starts in wake.wait()
            self.ctrl[C_WORKERS + 8 * w + W_SEEN] = self.ctrl[C_SEQ]
            ev = threading.Event()
            t = threading.Thread(target=self._worker_main, args=(w + 1, ev), name=f"pyggml-cpu-{w + 1}", daemon=True)
            self._wake.append(ev)
            self._workers.append(t)
            t.start()
        return nth

    def _worker_main(self, ith: int, wake: threading.Event) -> None:
        while True:
            wake.wait()
            wake.clear()
            while True:
                rc = worker_loop(self.addr, ith)
                if rc == R_PYTHON:
                    task = self._task
                    if task is not None:
                        task()
                    continue
                break
            if rc == R_EXIT:
                return

    def _command(self, kind: int, nth: int, fields: dict[int, int]) -> None:
        """Write a command for threads 1..nth-1 and publish it, waking sleeping workers."""
        c = self.ctrl
        seq_begin(self.addr)
        for word, value in fields.items():
            c[word] = value
        c[C_KIND], c[C_NTH] = kind, nth
        seq_end(self.addr)
        for w in range(nth - 1):
            if c[C_WORKERS + 8 * w + W_STATE] == S_SLEEPING:
                self._wake[w].set()

    def run_segment(self, fns: np.ndarray, recs: np.ndarray, n0: int, n1: int, nth: int,
                    wdata: np.ndarray, bars: np.ndarray | None = None) -> int:
        """Run plan nodes [n0, n1) on nth threads (the caller is thread 0); the failing node or -1.
        ``bars``: the barrier table (see run_nodes), or None for a barrier after every node."""
        nth = min(nth, len(self._workers) + 1)
        with sigint_held:
            self._command(K_NODES, nth, {C_FNS: fns.ctypes.data, C_RECS: recs.ctypes.data, C_N0: n0, C_N1: n1,
                                         C_WDATA: wdata.ctypes.data, C_WSIZE: wdata.nbytes,
                                         C_BARS: 0 if bars is None else bars.ctypes.data})
            return run_nodes(self.addr, 0)

    def run_python(self, task: Callable[[], None], nth: int) -> None:
        """Run ``task()`` on the caller and on ``nth - 1`` workers at once (the task shares out its
        own work and must tolerate a worker that joins late or not at all)."""
        nth = min(nth, len(self._workers) + 1)
        with sigint_held:
            if nth > 1:
                self._task = task
                self._command(K_PYTHON, nth, {})
            task()

    def shutdown(self) -> None:
        if self._workers:
            self._command(K_EXIT, len(self._workers) + 1, {})
            for ev in self._wake:
                ev.set()
            for t in self._workers:
                t.join(timeout=1.0)
        self._workers.clear()
        self._wake.clear()


class _SigintHold:
    """:data:`sigint_held`: Ctrl-C held back while thread 0 publishes a command and takes its part in it, then
    handled as usual.

    A KeyboardInterrupt raised between the two (Python runs signal handlers between any two bytecodes) left the
    workers inside the command, waiting at a barrier for a thread 0 that had gone: the next command's thread 0 met
    them there, and they went on with the old command's nodes over memory since reused, a segfault (``chat``'s
    Ctrl-C in a reply, once under load). Held, the interrupt comes when the command has ended, as it would have
    anyway: compiled code does not stop for it. Only the main thread handles signals, and only a Python handler
    is held (SIG_IGN and SIG_DFL are left alone). A stand-in handler goes in front of the current one once (and
    again if the program installs another), so a command pays about a microsecond, not two sigaction calls
    (11 us: a first run's Python kernels publish a command per node).

    Each stand-in passes signals on to the handler it was put in front of, so a program that saved a stand-in as
    its "previous handler", installed its own and put the saved one back (uvicorn does, around a server's run)
    gets its previous handler back, not the one it has removed (which a single stand-in went on calling: in one
    test run, uvicorn's exit flag instead of KeyboardInterrupt)."""

    def __init__(self) -> None:
        self.depth = 0
        self.held: tuple[int, object, Callable] | None = None  # a held signal and the handler it goes to

    def _stand_in(self, handler: Callable) -> Callable:
        def stand_in(signum: int, frame: object) -> None:
            if self.depth:
                self.held = (signum, frame, handler)
            else:
                handler(signum, frame)

        stand_in.passes_to = handler  # type: ignore[attr-defined]
        return stand_in

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        current = _signal.getsignal(signal.SIGINT)
        if getattr(current, "passes_to", None) is None:
            if not callable(current):
                return
            signal.signal(signal.SIGINT, self._stand_in(current))
        self.depth += 1

    def __exit__(self, *exc: object) -> None:
        if threading.current_thread() is not threading.main_thread() or not self.depth:
            return
        self.depth -= 1
        if self.depth or self.held is None:
            return
        (signum, frame, handler), self.held = self.held, None
        handler(signum, frame)


#: ``with sigint_held:`` around publishing a command and running thread 0's part (see _SigintHold)
sigint_held = _SigintHold()


_POOL: ThreadPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool() -> ThreadPool:
    """The process's thread pool (created on first use, recreated in a forked child)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPool()
        return _POOL


def _after_fork() -> None:
    global _POOL, _POOL_LOCK
    _POOL = None  # the workers did not survive the fork; a new pool starts its own
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)

"""The CPU thread pool's waits: a thread that sleeps (futex) instead of spinning still meets the others
at every barrier and takes every command, so results do not depend on how long the threads spin."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.opcheck import OpCase, values
from pyggml.backend.cpu.compute import graph_compute
from pyggml.backend.cpu.native import HAVE_FUTEX
from pyggml.backend.cpu.threads import BARRIER_SPINS, C_IDLE_SPIN, C_SPIN, C_SPIN_NOW, IDLE_SPINS, MIN_SPINS, get_pool
from pyggml.graph import Graph
from pyggml.ops import builders as B
from pyggml.tensor import Tensor
from pyggml.types import GGMLType


def _graph() -> tuple[Graph, Tensor]:
    """A mat-vec between two row-parallel ops: three barriers per compute, and chunks handed out."""
    c = OpCase()
    w = c.tensor(GGMLType.Q4_K, 512, 300)
    x = c.tensor(GGMLType.F32, 512, 1)
    out = B.soft_max(c.ctx, B.scale(c.ctx, B.mul_mat(c.ctx, w, B.rms_norm(c.ctx, x, 1e-5)), 0.1))
    g = Graph()
    g.build_forward_expand(out)
    return g, out


@pytest.fixture
def pool_that_sleeps_at_once():
    """The process's pool with no spinning at all: every wait that is not over at once goes to sleep."""
    pool = get_pool()
    pool.set_spins(0, 0)
    try:
        yield pool
    finally:
        pool.set_spins(BARRIER_SPINS, IDLE_SPINS)


@pytest.mark.parametrize("n_threads", [2, 3])
def test_sleeping_waits_give_the_same_results(pool_that_sleeps_at_once, n_threads: int) -> None:
    """3 threads on a 2-core machine as well: more threads than cores must still make progress."""
    g, out = _graph()
    graph_compute(g, 1)
    one = values(out)
    naps = pool_that_sleeps_at_once.naps()
    for _ in range(30):
        graph_compute(g, n_threads)
        np.testing.assert_array_equal(values(out), one)
    if HAVE_FUTEX:  # the threads really slept (and were woken: the computes above finished)
        assert pool_that_sleeps_at_once.naps() > naps


def test_spins_are_set_per_pool() -> None:
    pool = get_pool()
    try:
        pool.set_spins(7, -3)
        assert (pool.ctrl[C_SPIN], pool.ctrl[C_SPIN_NOW], pool.ctrl[C_IDLE_SPIN]) == (7, 7, 0)
    finally:
        pool.set_spins(BARRIER_SPINS, IDLE_SPINS)


def test_the_barrier_budget_stays_within_its_bounds() -> None:
    """The adaptive budget moves between MIN_SPINS and the configured spins; a configuration below MIN_SPINS
    (--poll 0 among them) is kept as it is."""
    pool = get_pool()
    g, _ = _graph()
    try:
        pool.set_spins(4 * MIN_SPINS, 0)
        for _ in range(20):
            graph_compute(g, 2)
            assert MIN_SPINS <= pool.ctrl[C_SPIN_NOW] <= 4 * MIN_SPINS
        for low in (MIN_SPINS // 2, 0):
            pool.set_spins(low, 0)
            for _ in range(5):
                graph_compute(g, 2)
                assert pool.ctrl[C_SPIN_NOW] == low
    finally:
        pool.set_spins(BARRIER_SPINS, IDLE_SPINS)


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler (KeyboardInterrupt) for the test: pytest-xdist's workers ignore SIGINT, and a
    test that ran before may have left any handler."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_between_publishing_a_command_and_running_it_waits_for_the_command(monkeypatch, python_sigint) -> None:
    """A Ctrl-C that arrives after thread 0 has published a command to the workers, before it takes its own part,
    is held until the command has run (threads.sigint_held): raised there, it left the workers waiting at a barrier
    inside the command, and the next command ran the old one's nodes (chat's Ctrl-C in a reply: a segfault). The
    interrupted compute's result is whole, and the pool serves the next compute (from another thread, so that a
    stuck pool fails the test instead of hanging it)."""
    import signal
    import threading

    g, out = _graph()
    graph_compute(g, 2)
    want = np.array(values(out))
    pool = get_pool()
    publish = pool._command

    def publish_then_ctrl_c(*args) -> None:
        publish(*args)
        # to this thread (os.kill's may go to a worker thread, and the main thread then meets it at some later
        # bytecode, or never within the compute): Python runs the handler right after this call returns
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(pool, "_command", publish_then_ctrl_c)
    out.view4()[...] = 0
    with pytest.raises(KeyboardInterrupt):
        graph_compute(g, 2)
    np.testing.assert_array_equal(np.array(values(out)), want)
    monkeypatch.setattr(pool, "_command", publish)
    done: list[np.ndarray] = []
    worker = threading.Thread(target=lambda: (graph_compute(g, 2), done.append(np.array(values(out)))), daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert done, "the pool did not serve the next compute"
    np.testing.assert_array_equal(done[0], want)


def test_a_restored_previous_handler_gets_ctrl_c_not_the_one_it_replaced(python_sigint) -> None:
    """A program that saves the SIGINT handler (a stand-in of sigint_held's), installs its own, computes, and puts
    the saved one back (uvicorn around a server's run) has Ctrl-C go to the handler it saved, not to the one it
    removed: the stand-in in front of that one passes on to it."""
    import signal

    g, _ = _graph()
    graph_compute(g, 2)  # a stand-in goes in front of Python's default handler
    saved = signal.getsignal(signal.SIGINT)
    removed: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: removed.append(signum))
    try:
        graph_compute(g, 2)  # and another in front of the program's own
        signal.raise_signal(signal.SIGINT)
        assert removed == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, saved)
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    assert removed == [signal.SIGINT]

"""Op kernels compiled with numba for the CPU backend's graph plans (plan.py).

Each compiled op has a *selector* (Python, run once when a plan is built) and one or more *kernels*
(numba ``cfunc``s with ggml's calling shape: ``void kernel(node record, ith, nth, ctrl)``). The
selector checks the node's types and layout and returns a :class:`Choice` (the kernel, extra
record words, scratch bytes), or None when the op's Python kernel should run instead (types or
layouts the compiled kernels do not cover). The numerics are those of the Python kernels in
``ops/<family>.py``, which stay the reference: tests compare the two.

Kernels compile on first use and are cached on disk by numba, so a model only compiles what its
graphs use; the kernels a new plan is missing compile side by side in helper processes, one per
core. The interactive commands do not wait for them (:func:`background_mode` "all"): the nodes run
their Python kernels while a background process compiles the kernels, and the plan is built again
once it has ended. ``PYGGML_JIT=0`` in the environment turns the compiled kernels off;
``PYGGML_JIT_PROCESSES=1`` compiles in this process only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from numba import types

from ....notice import first_run_time
from ....ops.enums import Op
from ....tensor import Tensor
from ..kernel_table import op_registrar
from ..numba_inline import install as install_inline_copy

#: the C signature of every compiled kernel (see native.call_kernel)
KERNEL_SIG = types.void(types.int64, types.int64, types.int64, types.int64)

_compile_lock = threading.RLock()
_noticed = False


def _notice(aside: bool = False) -> None:
    """The one line a first run prints (once a process): compiling now, or aside while the Python kernels run."""
    global _noticed
    if not _noticed:
        _noticed = True
        how = " in the background, the Python kernels running meanwhile" if aside else ""
        print(f"pyggml: compiling CPU kernels{how} (first run only; cached afterwards)...", file=sys.stderr,
              flush=True)


_nrt_ready = False


def _load_overload(cache, sig, ctx):
    """numba's ``Cache.load_overload`` without its ``refresh`` of the target context, which imports and
    installs numba's typing and lowering registries (0.3-0.7 s of a warm start, before the first kernel
    runs) that only compiling needs: loading cached machine code needs the NRT's symbols, nothing more (a
    compile later refreshes the context itself). None when the cache has no entry or cannot be read."""
    global _nrt_ready
    try:
        if not _nrt_ready:
            from numba.core.runtime import rtsys

            rtsys.initialize(ctx)
            _nrt_ready = True
        with cache._guard_against_spurious_io_errors():
            return cache._load_overload(sig, ctx)
    except Exception:  # an unreadable or foreign cache entry (or another numba's cache): compile instead
        return None


class JitKernel:
    """A kernel function compiled to a C callback on first use, through numba's on-disk cache.

    Wraps numba's ``CFunc`` (what ``@cfunc(cache=True)`` builds) so that a cache lookup and a
    compilation are separate steps: :func:`prepare` looks every kernel a plan needs up first and
    compiles only the missing ones, several at once in helper processes.
    """

    def __init__(self, fn: Callable[..., None]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.key = f"{fn.__module__}:{fn.__name__}"
        self._cf = None
        self._ready = False
        self._absent = False  # the disk cache was looked up and had no entry (compile() still looks again)

    def _cfunc(self):
        if self._cf is None:
            from numba.core import sigutils
            from numba.core.ccallback import CFunc

            self._cf = CFunc(self.fn, sigutils.normalize_signature(KERNEL_SIG), locals={},
                             options={"nopython": True, "error_model": "numpy"})
            self._cf.enable_caching()
        return self._cf

    def load_cached(self) -> bool:
        """Load the compiled kernel from numba's disk cache; False when it is not there."""
        if self._ready:
            return True
        if self._absent and not _done_in_background(self.key):
            return False
        with _compile_lock:
            cf = self._cfunc()
            cres = _load_overload(cf._cache, cf._sig, cf._targetdescr.target_context)
            if cres is None:
                self._absent = True
                return False
            cf._library = cres.library
            cf._wrapper_name = cres.fndesc.llvm_cfunc_wrapper_name
            cf._wrapper_address = cf._library.get_pointer_to_function(cf._wrapper_name)
            self._ready = True
            return True

    def compile(self) -> None:
        """Load from the cache, or compile and save to it."""
        if not self._ready:
            with _compile_lock:
                if not self._ready:
                    install_inline_copy()
                    self._cfunc().compile()
                    self._ready = True

    @property
    def address(self) -> int:
        self.compile()
        return self._cf.address

    def __repr__(self) -> str:
        return f"<JitKernel {self.key}>"


class JitFunction:
    """An ``@njit(cache=True)`` function at one signature, with :class:`JitKernel`'s interface, so that
    :func:`prepare` compiles it beside the kernels instead of on its first call, after them: the thread pool's
    loops (threads.run_nodes, worker_loop: 2-3 s of a cold first run, on one core while the other idled)."""

    def __init__(self, key: str, sig: tuple) -> None:
        self.key = key  # "module:name" of the dispatcher
        self.sig = sig
        self._ready = False
        self._absent = False

    def _dispatcher(self):
        import importlib

        module, name = self.key.split(":")
        return getattr(importlib.import_module(module), name)

    def load_cached(self) -> bool:
        """Add the cached compilation to the dispatcher; False when the disk cache has none."""
        if self._ready:
            return True
        if self._absent and not _done_in_background(self.key):
            return False
        with _compile_lock:
            disp = self._dispatcher()
            if self.sig in disp.overloads:
                self._ready = True
                return True
            cres = _load_overload(disp._cache, self.sig, disp.targetctx)
            if cres is None:
                self._absent = True
                return False
            disp.add_overload(cres)
            self._ready = True
            return True

    def compile(self) -> None:
        if not self._ready:
            with _compile_lock:
                if not self._ready:
                    install_inline_copy()
                    self._dispatcher().compile(self.sig)
                    self._ready = True

    def __repr__(self) -> str:
        return f"<JitFunction {self.key}{self.sig}>"


#: what every plan with a compiled node runs on (threads.ThreadPool: run_segment's run_nodes and the workers'
#: worker_loop, with the barrier and waits they call, and the command's seq_begin/seq_end); loaded or
#: compiled with the plan's first kernels
_I64_2, _I64_1 = (types.int64, types.int64), (types.int64,)
POOL_FUNCTIONS = tuple(JitFunction(f"pyggml.backend.cpu.threads:{name}", sig)
                       for name, sig in (("run_nodes", _I64_2), ("worker_loop", _I64_2), ("seq_begin", _I64_1),
                                         ("seq_end", _I64_1)))


def prepare(kernels: Iterable[JitKernel | JitFunction]) -> None:
    """Have every kernel compiled: cached ones are loaded, missing ones compiled, on as many
    processes as there are cores (numba compiles one function at a time per process; a model's
    first run compiles 10-20 kernels of 0.2-2 s each). The processes walk the same list and each
    takes the next kernel nobody has claimed yet, so one that drew long compiles does not leave
    the others idle. The thread pool's own functions (:data:`POOL_FUNCTIONS`) come along when there
    is any kernel. Then the kernels the plan's selectors queued for later (lean_unless_ready) start
    compiling in the background."""
    kernels = list(dict.fromkeys(kernels))
    if kernels:
        kernels += POOL_FUNCTIONS
    todo = [k for k in kernels if not k.load_cached()]
    if todo:
        _notice()
        with first_run_time():  # timings (prompt eval) leave the compile out
            _compile(todo)
    _start_background()


def _compile(todo: list[JitKernel | JitFunction]) -> None:
    """Compile the kernels that were not in the cache: here and in helper processes (see prepare)."""
    todo.sort(key=lambda k: not k.key.startswith(_SLOW))  # the longest compiles first, for an even finish
    n_proc = min(len(todo), _cores()) - 1
    if n_proc <= 0 or os.environ.get("PYGGML_JIT_PROCESSES") == "1":
        for k in todo:
            k.compile()
        return
    with tempfile.TemporaryDirectory(prefix="pyggml-jit-") as claims:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        helpers = [subprocess.Popen([sys.executable, "-c", f"import {__name__} as j; j._compile_keys()", claims,
                                     *(k.key for k in todo)], env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL) for _ in range(n_proc)]
        _compile_claimed(todo, claims)
        for h in helpers:
            h.wait()
    for k in todo:
        k.compile()  # from the cache a helper filled (or here, if a helper failed)


#: modules whose kernels take the longest to compile (1-2 s each: the products and the fused FFN)
_SLOW = tuple(f"pyggml.backend.cpu.{m}:" for m in ("traits", "quants.repacked", "ops.gate_up_jit", "ops.mat_f_jit",
                                                  "ops.attn_jit"))


def _compile_claimed(kernels: Iterable[JitKernel | JitFunction], claims: str) -> None:
    """Compile each kernel no other process has claimed (a claim is a file created exclusively in ``claims``;
    an empty ``claims``: every kernel)."""
    for k in kernels:
        if not claims:
            k.compile()
            continue
        try:
            os.close(os.open(os.path.join(claims, k.key.replace(":", "-")), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        k.compile()


def _cores() -> int:
    from ..threads import available_cores

    return available_cores()


def _compile_keys() -> None:
    """Entry point of a compile helper process: the claims folder, then the kernels to take turns on."""
    import importlib

    pool = {k.key: k for k in POOL_FUNCTIONS}
    kernels = []
    for key in sys.argv[2:]:
        module, name = key.split(":")
        kernels.append(pool[key] if key in pool else getattr(importlib.import_module(module), name))
    _compile_claimed(kernels, sys.argv[1])


def lean_unless_ready(lean: JitKernel, superset: JitKernel, later: bool = False) -> JitKernel:
    """``superset`` when it is compiled or in the disk cache already, else ``lean``: for a kernel whose
    paths are a subset of another's with the same results (a decode's one-column mat-vec, and the
    kernel that also groups columns). A first run compiles only the lean kernel for a short prompt, and
    a decode after a longer prompt reuses the prompt's kernel instead of compiling its own.

    ``later``: the superset is worth having (it is faster here), so it compiles in a background process
    while this plan takes the lean kernel, and a later plan finds it in the disk cache; with background
    compiles off (:func:`background`) it is compiled now instead, as any missing kernel."""
    if superset.load_cached():
        return superset
    if later:
        if not background():
            return superset
        compile_in_background(superset)
    return lean


#: the background mode when PYGGML_JIT_BACKGROUND is not set (set_background_default)
_background_default = "1"


def set_background_default(mode: str) -> None:
    """The mode :func:`background_mode` gives when PYGGML_JIT_BACKGROUND is not set: the interactive commands
    (generate, chat, serve) take "all", so that a first run answers before its kernels are compiled; the
    library and the measuring tools keep "1", so that a cold bench never times the Python kernels."""
    global _background_default
    if mode not in ("0", "1", "all"):
        raise ValueError(f"background compile mode must be '0', '1' or 'all', not {mode!r}")
    _background_default = mode


def background_mode() -> str:
    """PYGGML_JIT_BACKGROUND: "0" compiles every missing kernel before the plan runs (the test suite's setting:
    its processes leave nothing running behind them); "1" lets kernels that only make a plan faster compile in
    a background process while the plan runs on a kernel that is ready (lean_unless_ready); "all" does that
    for every missing kernel: its nodes run their Python kernels until the background compile has ended, and
    the plan is then built again (:func:`deferring`, plan.plan_for)."""
    mode = os.environ.get("PYGGML_JIT_BACKGROUND", _background_default)
    return mode if mode in ("0", "all") else "1"


def background() -> bool:
    """Whether any kernel may compile in the background (:func:`background_mode` is not "0")."""
    return background_mode() != "0"


def deferring() -> bool:
    """Whether a plan defers its missing kernels (:func:`background_mode` "all")."""
    return background_mode() == "all"


def missing(kernels: Iterable[JitKernel | JitFunction] | Choice) -> list[str]:
    """The keys of the kernels (or of those a :class:`Choice` runs: its own, its parts', its pending records')
    that are neither compiled nor in the disk cache, each queued for a background compile; one whose
    background compile already ended without leaving it in the cache is compiled now instead (where the real
    error then shows, rather than a new background process for every plan)."""
    if isinstance(kernels, Choice):
        c = kernels
        kernels = [c.kernel, *(p.kernel for _, p in c.parts), *(p.kernel for _, p in c.pending)]
    keys = []
    for k in kernels:
        if k.load_cached():
            continue
        if k.key in _started and not compiling([k.key]):
            k.compile()
            continue
        compile_in_background(k)
        keys.append(k.key)
    if keys:
        _notice(aside=True)
    return keys


def compiling(keys: Iterable[str]) -> bool:
    """Whether any of ``keys`` is still queued or compiling in a background process."""
    return any(k in _queued or (k in _background and _background[k].poll() is None) for k in keys)


#: kernels compiling in background processes (lean_unless_ready's ``later``): key -> process
_background: dict[str, subprocess.Popen] = {}
#: kernels to compile in the background once the plan asking for them has what it runs on (prepare)
_queued: dict[str, JitKernel | JitFunction] = {}
#: every kernel a background process was started for, in this process
_started: set[str] = set()


def compile_in_background(kernel: JitKernel | JitFunction) -> None:
    """Have ``kernel`` compiled into numba's disk cache in the background, starting when the plan being
    selected has its own kernels (:func:`prepare` starts one process for all a plan queued)."""
    if kernel.key not in _background:
        _queued[kernel.key] = kernel


def _start_background() -> None:
    """One process, of the lowest priority so that it takes only cores this one's threads leave idle,
    compiles the queued kernels; it is not waited for, and finishes if this process exits first (the next run
    then finds them cached). :meth:`JitKernel.load_cached` looks at the cache again once it has ended."""
    if not _queued:
        return
    keys = list(_queued)
    _queued.clear()
    proc = run_aside(f"import os; os.nice(19); import {__name__} as j; j._compile_keys()", "", *keys)
    for key in keys:
        _background[key] = proc
    _started.update(keys)


def run_aside(code: str, *args: str) -> subprocess.Popen:
    """Run Python ``code`` (with ``args`` as sys.argv[1:]) in a process beside this one, not waited for (it finishes
    if this process exits first): work this one would otherwise do itself a moment later, such as filling numba's
    disk cache (the background compiles; ops.mat.warm_aside)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _done_in_background(key: str) -> bool:
    """True once: when a background compile of ``key`` has ended (its kernel may now be in the disk cache)."""
    proc = _background.get(key)
    if proc is None or proc.poll() is None:
        return False
    del _background[key]
    return True


def ready_or_wanted(kernel: JitKernel) -> bool:
    """For a fusion that saves little and costs a first run a second or two of compiling (the FFN's gate/up
    with its GLU, ROPE into the KV cache: about 1% of a decode step, bench/node_profile.py): take it when its
    kernel is compiled or in the disk cache already, or when ``PYGGML_FUSION=all`` asks for it (and compiles
    it, for this run and the later ones). A cold first run stays short; the outputs are the same either way."""
    return fusion_mode() == "all" or kernel.load_cached()


def fusion_mode() -> str:
    """PYGGML_FUSION: "1" (the default: fusions, the costly ones once compiled), "0" (none) or "all"."""
    return os.environ.get("PYGGML_FUSION", "1")


def jit_kernel(fn: Callable[..., None]) -> JitKernel:
    """Declare a compiled kernel: ``fn(node, ith, nth, ctrl)`` in numba's nopython subset."""
    return JitKernel(fn)


@dataclass
class Choice:
    """What a selector picked for one node."""

    kernel: JitKernel
    ints: Sequence[int] = ()  # record words AUX.. (at most 8)
    floats: Sequence[float] = ()  # float32 values from record word AUX+8 on (at most 14)
    wsize: int = 0  # bytes of the shared work buffer the kernel uses
    notes: dict = field(default_factory=dict)  # objects the record points into (the plan keeps them)
    #: the earlier nodes a fused kernel computes with this one, in graph order, with their own choices: the
    #: plan writes their records beside the table and their addresses into AUX words 0.., before ``ints``
    parts: Sequence[tuple[Tensor, Choice]] = ()
    #: set on a fusion that is only worth it (or only has a kernel) once a later node completes it (gate and
    #: up, waiting for their GLU): the records to run instead, this node's last, when none does
    pending: Sequence[tuple[Tensor, Choice]] = ()


Selector = Callable[[Tensor], "Choice | None"]
#: the nodes of the graph being planned that take a tensor as a source (views included): what a fusion
#: that leaves part of an output unwritten checks (plan.py builds it on first use)
Readers = Callable[[Tensor], list[Tensor]]
SELECTORS: dict[Op, Selector] = {}


def selector(*ops: Op) -> Callable[[Selector], Selector]:
    """Register ``fn`` as the compiled-kernel selector of each op in ``ops`` (one selector per op)."""
    return op_registrar(SELECTORS, "compiled-kernel selectors", ops)


def enabled() -> bool:
    return os.environ.get("PYGGML_JIT", "1") != "0"


def select(node: Tensor) -> Choice | None:
    """The compiled kernel for ``node``, or None (its Python kernel runs)."""
    sel = SELECTORS.get(node.op)
    return None if sel is None else sel(node)


__all__ = [
    "POOL_FUNCTIONS",
    "SELECTORS",
    "Choice",
    "JitFunction",
    "JitKernel",
    "Readers",
    "background",
    "background_mode",
    "compile_in_background",
    "compiling",
    "deferring",
    "enabled",
    "fusion_mode",
    "jit_kernel",
    "lean_unless_ready",
    "missing",
    "prepare",
    "ready_or_wanted",
    "select",
    "selector",
    "set_background_default",
]

"""Raw memory, atomics and indirect calls for numba code: what the compiled executor is built from.

ggml-cpu's graph executor is C: every thread walks the node list, calls each op's kernel through a
pointer with its ``(ith, nth)`` and meets the others at a barrier after each node. pyggml's
compiled executor does the same inside numba, so a reused graph runs with no Python per node.
That needs a few things numba does not offer on its own, written here as LLVM intrinsics:

* a tensor's ``data`` (an integer address) as a typed pointer, so a kernel reads any buffer
  through ``numba.carray(f32p(addr), n)`` without numpy views;
* sequentially consistent atomics on int64 words (barrier counters, work-chunk counters);
* the CPU's spin-wait hint, ``sched_yield`` and Linux's futex wait/wake, for a barrier and an idle
  wait that spin a bounded time and then sleep, so a thread whose core is shared with another busy
  process gives the core up instead of burning its time slices;
* a call through a function address (each op kernel is a ``cfunc`` compiled on first use).
"""

from __future__ import annotations

import platform
import sys

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I64 = ir.IntType(64)
_I32 = ir.IntType(32)


def _pointer_intrinsic(nbtype: types.Type, lltype: ir.Type, doc: str):
    def typer(typingctx, addr):
        if not isinstance(addr, types.Integer):
            return None
        sig = types.CPointer(nbtype)(addr)

        def codegen(context, builder, sig, args):
            v = args[0] if args[0].type.width == 64 else builder.sext(args[0], _I64)
            return builder.inttoptr(v, lltype.as_pointer())

        return sig, codegen

    typer.__doc__ = doc
    return intrinsic(typer)


f32p = _pointer_intrinsic(types.float32, ir.FloatType(), "address -> float32*")
f64p = _pointer_intrinsic(types.float64, ir.DoubleType(), "address -> float64*")
i8p = _pointer_intrinsic(types.int8, ir.IntType(8), "address -> int8*")
u8p = _pointer_intrinsic(types.uint8, ir.IntType(8), "address -> uint8*")
u16p = _pointer_intrinsic(types.uint16, ir.IntType(16), "address -> uint16*")
i32p = _pointer_intrinsic(types.int32, _I32, "address -> int32*")
u32p = _pointer_intrinsic(types.uint32, _I32, "address -> uint32*")
i64p = _pointer_intrinsic(types.int64, _I64, "address -> int64*")


def _word(builder: ir.IRBuilder, addr: ir.Value) -> ir.Value:
    return builder.inttoptr(addr, _I64.as_pointer())


@intrinsic
def atomic_add(typingctx, addr, value):
    """*addr += value atomically (seq_cst); returns the old value."""
    sig = types.int64(types.int64, types.int64)

    def codegen(context, builder, sig, args):
        return builder.atomic_rmw("add", _word(builder, args[0]), args[1], "seq_cst")

    return sig, codegen


@intrinsic
def atomic_load(typingctx, addr):
    """*addr, read atomically (seq_cst)."""
    sig = types.int64(types.int64)

    def codegen(context, builder, sig, args):
        return builder.load_atomic(_word(builder, args[0]), "seq_cst", 8)

    return sig, codegen


@intrinsic
def atomic_store(typingctx, addr, value):
    """*addr = value atomically (seq_cst)."""
    sig = types.void(types.int64, types.int64)

    def codegen(context, builder, sig, args):
        builder.store_atomic(args[1], _word(builder, args[0]), "seq_cst", 8)
        return context.get_dummy_value()

    return sig, codegen


_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


@intrinsic
def cpu_relax(typingctx):
    """The spin-wait hint (x86 ``pause``); nothing elsewhere."""
    sig = types.void()

    def codegen(context, builder, sig, args):
        if _X86:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def sched_yield(typingctx):
    """libc's sched_yield(): let another thread run on this core."""
    sig = types.int32()

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, []), "sched_yield")
        return builder.call(fn, [])

    return sig, codegen


#: Linux's futex system call number on the architectures where it is known (None: no futex; the waits
#: then fall back to sched_yield). The futex word is the low half of an int64 control word, so the
#: byte order must put it first.
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower())
HAVE_FUTEX = sys.platform.startswith("linux") and sys.byteorder == "little" and _SYS_FUTEX is not None
_FUTEX_WAIT_PRIVATE = 0 | 128  # FUTEX_WAIT | FUTEX_PRIVATE_FLAG: the waiters are threads of this process
_FUTEX_WAKE_PRIVATE = 1 | 128


def _syscall(builder: ir.IRBuilder, args: list[ir.Value]) -> ir.Value:
    fnty = ir.FunctionType(_I64, [_I64], var_arg=True)
    fn = cgutils.get_or_insert_function(builder.module, fnty, "syscall")
    return builder.call(fn, args)


@intrinsic
def futex_wait(typingctx, addr, expected):
    """Sleep while the 32-bit word at ``addr`` (the low half of an int64) equals ``expected``'s low half.

    The kernel compares and sleeps in one step, so a wake-up that comes between the caller's last
    check and this call is not lost: the call returns at once. It may also return spuriously; the
    caller re-checks its condition. Only call when :data:`HAVE_FUTEX`."""
    sig = types.int64(types.int64, types.int64)

    def codegen(context, builder, sig, args):
        val = builder.and_(args[1], ir.Constant(_I64, 0xFFFFFFFF))
        return _syscall(builder, [ir.Constant(_I64, _SYS_FUTEX or 0), args[0],
                                  ir.Constant(_I64, _FUTEX_WAIT_PRIVATE), val, ir.Constant(_I64, 0)])

    return sig, codegen


@intrinsic
def futex_wake(typingctx, addr):
    """Wake every thread sleeping in :func:`futex_wait` on ``addr``. Only call when :data:`HAVE_FUTEX`."""
    sig = types.int64(types.int64)

    def codegen(context, builder, sig, args):
        return _syscall(builder, [ir.Constant(_I64, _SYS_FUTEX or 0), args[0],
                                  ir.Constant(_I64, _FUTEX_WAKE_PRIVATE), ir.Constant(_I64, 0x7FFFFFFF)])

    return sig, codegen


#: the C signature of every compiled op kernel: (node record address, ith, nth, control block address)
KERNEL_ARGS = 4


@intrinsic
def call_kernel(typingctx, fn, node, ith, nth, ctrl):
    """Call the kernel at address ``fn`` as ``void fn(int64 node, int64 ith, int64 nth, int64 ctrl)``."""
    sig = types.void(types.int64, types.int64, types.int64, types.int64, types.int64)

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.VoidType(), [_I64] * KERNEL_ARGS)
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), list(args[1:]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def f32_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the int32 ``bits`` (a register bitcast, so loops stay vectorizable)."""
    if not isinstance(bits, types.Integer):
        return None
    sig = types.float32(bits)

    def codegen(context, builder, sig, args):
        v = args[0]
        if v.type.width != 32:
            v = builder.trunc(v, _I32) if v.type.width > 32 else builder.sext(v, _I32)
        return builder.bitcast(v, ir.FloatType())

    return sig, codegen


@intrinsic
def f32_bits(typingctx, x):
    """The int32 bit pattern of the float32 ``x`` (a register bitcast)."""
    if x != types.float32:
        return None
    sig = types.int32(x)

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], _I32)

    return sig, codegen


@intrinsic
def fmaf(typingctx, a, b, c):
    """a*b + c in float32 with one rounding (llvm.fma.f32: vfmadd on FMA CPUs), as C's fmaf."""
    if not (a == b == c == types.float32):
        return None
    sig = types.float32(a, b, c)

    def codegen(context, builder, sig, args):
        f = ir.FloatType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f, [f] * 3), "llvm.fma.f32")
        return builder.call(fn, list(args))

    return sig, codegen

"""Write tests/data/vec_dot/vec_dot.npz: ggml-cpu's own vec_dot of quantized weight rows with activation rows.

Not run by the tests (they read what this wrote). Needs llama.cpp 0c1e570's shared libraries, as
../shared/tools/build_llamacpp.sh builds them (its build/bin holds libggml-base.so and libggml-cpu.so):

    python tests/data/vec_dot/make_vec_dot.py /path/to/llama.cpp/build/bin

Per type: ``x`` (N_ACT x K float32 activations), ``w`` (M weight rows quantized by ggml_quantize_chunk from
random normal floats, raw bytes; IQ2_XXS and IQ2_XS with a random importance matrix, as ggml requires) and
``out`` (N_ACT x M): ``type_traits_cpu[type].vec_dot`` of every weight row with every activation row after the
CPU's own ``from_float`` to the type's vec_dot_type (Q8_K, Q8_0/Q8_1, F16, BF16), the decode product llama.cpp runs
on this CPU (AVX2/AVX-512 paths).
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
#: ggml type ids (ggml.h): the types pyggml has fused mat-vec kernels for, and the float weights
TYPES = {"f16": 1, "bf16": 30, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q2_K": 10, "q3_K": 11,
         "q4_K": 12, "q5_K": 13, "q6_K": 14, "iq3_xxs": 18, "iq4_nl": 20, "iq3_s": 21,
         "iq4_xs": 23, "iq2_xxs": 16, "iq2_xs": 17, "iq2_s": 22}
#: the types ggml_quantize_chunk needs an importance matrix for (ggml_quantize_requires_imatrix): given a random
#: positive one, drawn after every other type's rows (the earlier types' rows stay what they were)
NEEDS_IMATRIX = {"iq2_xxs", "iq2_xs"}
M, K, N_ACT, SEED = 12, 1024, 3, 4321


class TraitsCPU(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p), ("vec_dot_type", ctypes.c_int),
                ("nrows", ctypes.c_int64)]


FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                           ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def main() -> None:
    lib_dir = Path(sys.argv[1])
    base = ctypes.CDLL(str(lib_dir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(lib_dir / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    cpu.ggml_cpu_init()
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TraitsCPU)
    base.ggml_row_size.restype = ctypes.c_size_t
    base.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    base.ggml_quantize_chunk.restype = ctypes.c_size_t
    base.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                         ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    rng = np.random.default_rng(SEED)
    arrays: dict[str, np.ndarray] = {}
    for name, tid in TYPES.items():
        wf = (rng.standard_normal((M, K)) * rng.uniform(0.2, 2.0, (M, 1))).astype(np.float32)
        x = (rng.standard_normal((N_ACT, K)) * rng.uniform(0.5, 3.0, (N_ACT, 1))).astype(np.float32)
        w = np.zeros((M, base.ggml_row_size(tid, K)), np.uint8)
        imatrix = rng.uniform(0.5, 2.0, K).astype(np.float32) if name in NEEDS_IMATRIX else None
        base.ggml_quantize_chunk(tid, wf.ctypes.data, w.ctypes.data, 0, M, K,
                                 None if imatrix is None else imatrix.ctypes.data)
        tr = cpu.ggml_get_type_traits_cpu(tid).contents
        act = cpu.ggml_get_type_traits_cpu(tr.vec_dot_type).contents
        y = np.zeros((N_ACT, base.ggml_row_size(tr.vec_dot_type, K)), np.uint8)
        for j in range(N_ACT):
            FROM_FLOAT(act.from_float)(x[j].ctypes.data, y[j].ctypes.data, K)
        out = np.zeros((N_ACT, M), np.float32)
        s = np.zeros(1, np.float32)
        for j in range(N_ACT):
            for r in range(M):
                VEC_DOT(tr.vec_dot)(K, s.ctypes.data, 0, w[r].ctypes.data, 0, y[j].ctypes.data, 0, 1)
                out[j, r] = s[0]
        arrays.update({f"{name}_x": x, f"{name}_w": w, f"{name}_out": out})
    np.savez_compressed(HERE / "vec_dot.npz", **arrays)
    print(f"wrote {HERE / 'vec_dot.npz'}: {len(TYPES)} types")


if __name__ == "__main__":
    main()

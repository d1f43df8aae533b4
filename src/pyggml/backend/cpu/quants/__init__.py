"""The CPU's block dot products, activation quantizers and product micro-kernels (ggml-cpu's quants.c,
arch/x86/quants.c, the repacked gemv/gemm of repack.cpp and llamafile's sgemm tiles)."""

"""Every architecture's speed against llama-bench on the same files: random-weight Q8_0 models of about
100 MB, one per architecture (tests/helpers/arch_models.py's specs at bigger sizes), measured interleaved
by bench/vs_llamacpp.py.

    python -P bench/arch_speed.py --llama-bench .../llama-bench [--out DIR] [--dims 1024,8,2,128,2816,8,704]
        [-p 128 -n 64 -r 2 --rounds 2] [ARCH ...]

The tiny test models measure only the per-step cost (a 0.3 MB model decodes in a fraction of a
millisecond); these read about 100 MB of weights per token, as a small real model does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"


def _write(name: str, dims: str, out: Path) -> Path:
    """The model as Q8_0 (written in F32 by the specs' writer in a child process, so that its sizes take
    PYGGML_ARCH_MODEL_DIMS, then quantized by pyggml)."""
    q8 = out / f"{name}-q8_0.gguf"
    if q8.exists():
        return q8
    f32 = out / f"{name}.gguf"
    env = dict(os.environ, PYGGML_ARCH_MODEL_DIMS=dims, PYTHONPATH=os.pathsep.join([str(TESTS), *sys.path]))
    code = f"from helpers import arch_models; arch_models.write({name!r}, {str(f32)!r})"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    subprocess.run([sys.executable, "-m", "pyggml.cli.main", "quantize", str(f32), str(q8), "q8_0"], check=True,
                   stdout=subprocess.DEVNULL)
    f32.unlink()
    return q8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("archs", nargs="*", help="model names of arch_models.SPECS (default: all)")
    ap.add_argument("--llama-bench", required=True, help="path of llama.cpp's llama-bench")
    ap.add_argument("--out", type=Path, default=Path("/tmp/pyggml-arch-speed"), help="folder for the models")
    ap.add_argument("--dims", default="1024,8,2,128,2816,8,704",
                    help="n_embd,n_head,n_head_kv,head,n_ff,n_layer,n_ff_exp (default: about 100 MB in Q8_0)")
    ap.add_argument("-p", default="128")
    ap.add_argument("-n", default="64")
    ap.add_argument("-r", default="2")
    ap.add_argument("--rounds", default="2")
    a = ap.parse_args()
    sys.path.insert(0, str(TESTS))
    from helpers import arch_models

    names = a.archs or list(arch_models.SPECS)
    a.out.mkdir(parents=True, exist_ok=True)
    models = [_write(n, a.dims, a.out) for n in names]
    cmd = [sys.executable, "-P", str(HERE / "vs_llamacpp.py"), "--llama-bench", a.llama_bench, "-p", a.p, "-n", a.n,
           "-r", a.r, "-t", "2", "--rounds", a.rounds]
    for m in models:
        cmd += ["-m", str(m)]
    raise SystemExit(subprocess.run(cmd).returncode)


if __name__ == "__main__":
    main()

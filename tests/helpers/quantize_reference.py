"""Make tests/data/quantize/reference.json: llama-quantize's outputs' SHA-256 for the test models.

Needs a llama.cpp build (``LLAMA_QUANTIZE=/path/to/llama-quantize``); CI only reads the JSON. Each case is
(model, imatrix or none, llama-quantize options, file type); a case llama-quantize refuses records
``"error": true`` (e.g. IQ2_XXS without an imatrix), and pyggml must refuse it too.

    LLAMA_QUANTIZE=.../llama-quantize python tests/helpers/quantize_reference.py
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, when run as a script
from helpers.data import data_path
from helpers.quantize_models import make_models

DATA = data_path("quantize")

ALL_FTYPES = ["Q1_0", "Q2_0", "Q4_0", "Q4_1", "MXFP4_MOE", "Q5_0", "Q5_1", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M",
              "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "Q2_K", "Q2_K_S", "IQ3_XXS", "IQ3_S", "IQ3_M", "IQ3_XS",
              "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_NL", "IQ4_XS", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K",
              "Q8_0", "F16", "BF16", "F32", "COPY"]
#: the 8-layer model runs the types whose rules look at layer positions (it is the slow one)
LAYER_FTYPES = ["Q2_K", "Q2_K_S", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_M", "IQ4_NL", "IQ4_XS",
                "IQ3_XS", "IQ3_XXS", "IQ3_M", "IQ2_M", "IQ1_S", "Q4_0", "Q5_0"]


def cases() -> list[dict]:
    out: list[dict] = []
    for model in ("qwen3odd", "llama2f16"):
        for imatrix in (False, True):
            out += [dict(model=model, imatrix=imatrix, options=[], ftype=f) for f in ALL_FTYPES]
    for imatrix in (False, True):
        out += [dict(model="llama8", imatrix=imatrix, options=[], ftype=f) for f in LAYER_FTYPES]
    opts = [
        ["--pure"],
        ["--leave-output-tensor"],
        ["--output-tensor-type", "q4_0", "--token-embedding-type", "iq4_nl"],
        ["--tensor-type", "attn_v=q8_0", "--tensor-type", "blk\\.[0-3]\\.ffn=q5_1"],
        ["--prune-layers", "2,5"],
        ["--override-kv", "llama.context_length=int:1024", "--override-kv", "general.name=str:pruned"],
    ]
    out += [dict(model="llama8", imatrix=False, options=o, ftype="Q4_K_M") for o in opts]
    out += [dict(model="llama2bf16", imatrix=False, options=[], ftype=f) for f in ("Q4_K_M", "Q8_0", "BF16", "COPY")]
    # 3-d expert tensors: per-expert imatrix slices, MXFP4 for experts, layer parsing by name
    out += [dict(model="moe2", imatrix=True, options=[], ftype=f)
            for f in ("Q4_K_M", "IQ2_XS", "IQ3_XXS", "MXFP4_MOE", "Q2_K_S", "IQ4_XS", "Q5_0")]
    out += [dict(model="moe2", imatrix=False, options=[], ftype=f) for f in ("Q4_K_M", "MXFP4_MOE", "IQ2_XS")]
    out += [dict(model="llama8", imatrix=True, options=o, ftype="IQ3_XS") for o in
            (["--exclude-weights", "ffn_down"], ["--include-weights", "attn"], ["--prune-layers", "0,7"])]
    return out


def case_id(c: dict) -> str:
    o = "-".join(a.lstrip("-").replace("\\", "").replace("=", "_") for a in c["options"])
    return f"{c['model']}-{c['ftype']}{'-imatrix' if c['imatrix'] else ''}{'-' + o if o else ''}"


def main() -> int:
    lq = os.environ.get("LLAMA_QUANTIZE", "llama-quantize")
    ref: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        inputs = {m: (p, im, hashlib.sha256(p.read_bytes()).hexdigest()) for m, (p, im) in make_models(tmp).items()}
        for c in cases():
            model, im, _ = inputs[c["model"]]
            out = tmp / "out.gguf"
            out.unlink(missing_ok=True)
            # relative names: quantize.imatrix.file records the path as given
            argv = [lq, *c["options"], *(["--imatrix", im.name] if c["imatrix"] else []), model.name, out.name,
                    c["ftype"], "2"]
            rc = subprocess.run(argv, capture_output=True, cwd=tmp).returncode
            entry = {**c, "error": rc != 0}
            if rc == 0:
                entry["sha256"] = hashlib.sha256(out.read_bytes()).hexdigest()
                entry["size"] = out.stat().st_size
            ref[case_id(c)] = entry
            print(case_id(c), "error" if rc else entry["sha256"][:16], flush=True)
    doc = {"models": {m: v[2] for m, v in inputs.items()},
           "note": "run in the models' directory with relative names: --imatrix MODEL.imatrix.gguf MODEL.gguf out.gguf",
           "cases": ref}
    (DATA / "reference.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``llama-imatrix --show-statistics``: per-tensor summaries of an importance matrix.

Per tensor, over its mean squared activations (sums / count per matrix): total, min, max, mean, standard
deviation, share of active columns (> 1e-5), entropy of the normalised distribution, the share of columns
more than one deviation above the mean (ZD), and the cosine similarity with the same tensor one layer up.
Then per layer the element-weighted averages. Computed in float64 and printed as llama.cpp's table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .imatrix_io import IMatrix


@dataclass
class TensorStats:
    name: str
    values: np.ndarray
    total: float
    min: float
    max: float
    mean: float
    stddev: float
    active: float
    elements: int
    entropy: float
    zd: float
    cossim: float = 0.0


def _split_name(name: str) -> tuple[str, str]:
    """``process_tensor_name``: (layer, short tensor name), e.g. ("3", "attn_q")."""
    parts = name.split(".")
    layer = next((parts[i + 1] for i, p in enumerate(parts[:-1]) if p == "blk"), "-")
    tensor = next((parts[i - 1] for i, p in enumerate(parts) if p == "weight" and i > 0), name)
    return layer, tensor


def tensor_statistics(im: IMatrix) -> list[TensorStats]:
    """Statistics for every entry with data, sorted as llama.cpp sorts them (short name, then total)."""
    out: list[TensorStats] = []
    for name, e in im.entries.items():
        sums = np.asarray(e.sums, dtype=np.float64)
        n = len(e.counts)
        if n == 0 or sums.size % n:
            continue
        per = sums.reshape(n, -1)
        acts = np.concatenate([per[i] / c for i, c in enumerate(e.counts) if c != 0] or [np.zeros(0)])
        if acts.size == 0:
            continue
        total = float(acts.sum())
        mean = total / acts.size
        dev = float(np.sqrt(max(0.0, float((acts * acts).sum()) / acts.size - mean * mean)))
        p = acts / total if total > 0 else np.zeros_like(acts)
        p = p[p > 0]
        entropy = float(-(p * np.log2(p)).sum()) if total > 0 else 0.0
        zd = float(((acts - mean) / dev > 1).sum()) / acts.size if dev > 0 else 0.0
        out.append(TensorStats(name, sums, total, float(acts.min()), float(acts.max()), mean, dev,
                               1 - float((np.abs(acts) <= 1e-5).sum()) / acts.size, int(acts.size), entropy, zd))
    by_name = {t.name: t for t in out}
    for t in out:
        m = re.search(r"blk\.(\d+)\.", t.name)
        if m is None:
            continue
        prev = by_name.get(t.name[: m.start(1)] + str(int(m.group(1)) - 1) + t.name[m.end(1):])
        if prev is not None and prev.values.size == t.values.size:
            denom = float(np.linalg.norm(t.values) * np.linalg.norm(prev.values))
            t.cossim = float(t.values @ prev.values) / denom if denom > 0 else 0.0
    out.sort(key=lambda t: (_split_name(t.name)[1], -t.total))
    return out


def format_statistics(im: IMatrix) -> str:
    """The two tables llama-imatrix prints (per tensor, then per layer)."""
    ts = tensor_statistics(im)
    lines = [f"Computing statistics ({len(ts)} tensors)", "",
             " Layer\t       Tensor\t          Σ(Act²)\t  Min\t            Max\t           μ\t   σ\t % Active\tN"
             "\t   Entropy\tE (norm)\tZD\t  CosSim", "=" * 120]
    layers: dict[int, list[float]] = {}
    for t in ts:
        layer, short = _split_name(t.name)
        e_norm = 100.0 * t.entropy / np.log2(t.elements) if t.elements > 1 else 0.0
        lines.append(f"{layer:>5}\t{short:<20}\t{t.total:10.2f}\t{t.min:8.4f}\t{t.max:11.4f}\t{t.mean:6.2f}\t"
                     f"{t.stddev:6.2f}\t{t.active * 100:8.2f}%\t{t.elements:6d}\t{t.entropy:10.4f}\t{e_norm:6.2f}%\t"
                     f"{100 * t.zd:10.2f}%\t{t.cossim:8.4f}")
        if layer.isdigit():
            w = layers.setdefault(int(layer), [0.0, 0.0, 0.0, 0.0])
            w[0] += t.elements * t.total
            w[1] += t.elements * t.zd
            w[2] += t.elements * t.cossim
            w[3] += t.elements
    lines += ["", f"Computing weighted average statistics per layer ({len(layers)} layers)", "",
              "  Layer\t     μΣ(Act²)\t      μZD\tμCosSim", "=" * 48]
    for layer in sorted(layers):
        b, z, c, n = layers[layer]
        if n:
            lines.append(f"{layer:5d}\t{b / n:14.2f}\t{100 * z / n:10.4f}%\t{c / n:6.4f}")
    return "\n".join(lines) + "\n"

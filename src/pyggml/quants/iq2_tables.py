"""Lookup tables of the 2-bit and 1-bit i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M).

Two kinds of tables exist, exactly as in ggml:

* the *dequantization* grids of ggml-common.h (``iq2xxs_grid``, ``iq2xs_grid``, ``iq2s_grid``,
  ``iq1s_grid``), eight byte-values per entry, stored in ``data/*.npy``;
* the *quantization* tables that ggml builds at run time in ``iq2xs_init_impl``
  (ggml-quants.c): the grid unpacked from the ``kgrid_*`` lists (``data/kgrid_*.txt``), a map
  from every packed point to its grid index, and for each point that is not on the grid a
  list of its nearest grid points. Building them is a few hundred million integer operations,
  so it happens lazily, once per table, and is cached for the life of the process.

See ``data/README.md`` for where every number comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numba as nb
import numpy as np

from ..types import GGMLType
from ._blocks import load_table

DATA_DIR = Path(__file__).with_name("data")

#: every index a packed point can have: 8 coordinates of 2 bits, the largest on-grid one is 0xAAAA
KMAP_SIZE = 43692

#: ggml-common.h: NGRID_IQ1S
NGRID_IQ1S = 2048

#: ggml-common.h: IQ1S_DELTA / IQ1M_DELTA
IQ1_DELTA = np.float32(0.125)

#: kmask_iq2xs (ggml-common.h): bit j of a sign byte flips coordinate j
KMASK_IQ2XS = (1 << np.arange(8)).astype(np.uint8)


@dataclass(frozen=True)
class _TableSpec:
    kgrid_file: str
    grid_file: str
    nwant: int


# which kgrid list and how many distance levels of neighbours each type keeps (iq2xs_init_impl)
_SPECS: dict[GGMLType, _TableSpec] = {
    GGMLType.IQ2_XXS: _TableSpec("kgrid_2bit_256.txt", "iq2xxs_grid.npy", 2),
    GGMLType.IQ2_XS: _TableSpec("kgrid_2bit_512.txt", "iq2xs_grid.npy", 2),
    GGMLType.IQ2_S: _TableSpec("kgrid_2bit_1024.txt", "iq2s_grid.npy", 1),
    GGMLType.IQ1_S: _TableSpec("kgrid_1bit_2048.txt", "iq1s_grid.npy", 3),
    GGMLType.IQ1_M: _TableSpec("kgrid_1bit_2048.txt", "iq1s_grid.npy", 3),
}


def load_kgrid(name: str) -> np.ndarray:
    """A packed ``kgrid_*`` list from ggml-quants.c, as uint16 (comment lines start with '#')."""
    return load_table(name).astype(np.uint16)


@cache
def common_grid_u64(qtype: GGMLType) -> np.ndarray:
    """The ggml-common.h dequantization grid of ``qtype`` as uint64 words (read-only)."""
    grid = np.load(DATA_DIR / _SPECS[GGMLType(qtype)].grid_file)
    grid.setflags(write=False)
    return grid


@cache
def common_grid_bytes(qtype: GGMLType) -> np.ndarray:
    """The same grid as (n, 8) bytes: uint8 magnitudes for IQ2, int8 values in {-1, 0, 1} for IQ1."""
    qtype = GGMLType(qtype)
    signed = qtype in (GGMLType.IQ1_S, GGMLType.IQ1_M)
    raw = common_grid_u64(qtype).astype("<u8").view(np.int8 if signed else np.uint8).reshape(-1, 8)
    raw.setflags(write=False)
    return raw


@cache
def ksigns_iq2xs() -> np.ndarray:
    """ksigns_iq2xs (ggml-common.h): 7 stored sign bits -> 8 sign bits of even parity."""
    table = np.load(DATA_DIR / "ksigns_iq2xs.npy")
    table.setflags(write=False)
    return table


def unpack_kgrid(kgrid: np.ndarray) -> np.ndarray:
    """The grid iq2xs_init_impl builds: coordinate i of entry k is 2*((kgrid[k] >> 2i) & 3) + 1."""
    shifts = 2 * np.arange(8, dtype=np.uint16)
    levels = (kgrid.astype(np.uint16)[:, None] >> shifts) & 3
    return (2 * levels + 1).astype(np.int8)


@nb.njit(cache=True)
def _distances(grid: np.ndarray, i: int, pos: np.ndarray, dist: np.ndarray, hist: np.ndarray):  # pragma: no cover
    """Squared distances from packed point ``i`` to every grid point (into ``dist``) and how many
    grid points lie at each distance (into ``hist``)."""
    for k in range(8):
        pos[k] = 2 * ((i >> (2 * k)) & 3) + 1
    hist[:] = 0
    for j in range(grid.shape[0]):
        d2 = 0
        for k in range(8):
            diff = grid[j, k] - pos[k]
            d2 += diff * diff
        dist[j] = d2
        hist[d2] += 1


@nb.njit(cache=True)
def _neighbour_lists(grid: np.ndarray, kmap: np.ndarray, nwant: int) -> np.ndarray:  # pragma: no cover
    """Fill kmap's off-grid slots and return the flat neighbour array, ggml's layout.

    For an off-grid point ``i``, ``kmap[i] = -(start + 1)``; ``neighbours[start]`` is the count
    and the grid indices follow, ordered by (squared distance, index) - qsort's order in ggml,
    which is total, so the result does not depend on the sort algorithm. Only the points at the
    ``nwant`` smallest distinct distances are kept.
    """
    n_grid = grid.shape[0]
    n_map = kmap.shape[0]
    max_d2 = 8 * 7 * 7 + 1
    # first pass: how many neighbours each off-grid point gets
    counts = np.zeros(n_map, dtype=np.int64)
    dist = np.empty(n_grid, dtype=np.int64)
    hist = np.zeros(max_d2, dtype=np.int64)
    pos = np.empty(8, dtype=np.int64)
    total = 0
    for i in range(n_map):
        if kmap[i] >= 0:
            continue
        _distances(grid, i, pos, dist, hist)
        have = 0
        n = 0
        for d2 in range(max_d2):
            if hist[d2]:
                n += hist[d2]
                have += 1
                if have == nwant:
                    break
        counts[i] = n
        total += n + 1
    neighbours = np.empty(total, dtype=np.uint16)
    # second pass: write the lists, level by level, indices ascending within a level
    start = 0
    for i in range(n_map):
        if kmap[i] >= 0:
            continue
        _distances(grid, i, pos, dist, hist)
        kmap[i] = -(start + 1)
        neighbours[start] = counts[i]
        out = start + 1
        have = 0
        for d2 in range(max_d2):
            if hist[d2] == 0:
                continue
            for j in range(n_grid):
                if dist[j] == d2:
                    neighbours[out] = j
                    out += 1
            have += 1
            if have == nwant:
                break
        start += counts[i] + 1
    return neighbours


@dataclass(frozen=True)
class QuantTables:
    """What ``iq2xs_init_impl`` builds for one type (``iq2_data[gindex]`` in ggml)."""

    #: (n, 8) int8 grid coordinates, each 1, 3 or 5 (= 2*level + 1)
    grid: np.ndarray
    #: (KMAP_SIZE,) int32: grid index of an on-grid packed point, else -(start+1) into neighbours
    kmap: np.ndarray
    #: flat uint16: per off-grid point a count followed by that many grid indices
    neighbours: np.ndarray


def build_quant_tables(kgrid: np.ndarray, nwant: int) -> QuantTables:
    """Build grid, map and neighbour lists from a packed kgrid list (iq2xs_init_impl)."""
    grid = unpack_kgrid(kgrid)
    kmap = np.full(KMAP_SIZE, -1, dtype=np.int32)
    # ggml recomputes the packed index from the unpacked grid: (value - 1) / 2 per coordinate
    levels = ((grid.astype(np.int32) - 1) // 2) << (2 * np.arange(8, dtype=np.int32))
    kmap[levels.sum(axis=1)] = np.arange(grid.shape[0], dtype=np.int32)
    neighbours = _neighbour_lists(grid.astype(np.int64), kmap, nwant)
    for arr in (grid, kmap, neighbours):
        arr.setflags(write=False)
    return QuantTables(grid, kmap, neighbours)


@cache
def quant_tables(qtype: GGMLType) -> QuantTables:
    """The quantizer tables of ``qtype``, built on first use (ggml_quantize_init's job)."""
    qtype = GGMLType(qtype)
    if qtype == GGMLType.IQ1_M:  # ggml shares one slot between IQ1_S and IQ1_M
        return quant_tables(GGMLType.IQ1_S)
    spec = _SPECS[qtype]
    return build_quant_tables(load_kgrid(spec.kgrid_file), spec.nwant)


def kgrid_file(qtype: GGMLType) -> str:
    """Name of the data file holding ``qtype``'s packed kgrid list."""
    return _SPECS[GGMLType(qtype)].kgrid_file


__all__ = [
    "IQ1_DELTA",
    "KMAP_SIZE",
    "KMASK_IQ2XS",
    "NGRID_IQ1S",
    "QuantTables",
    "build_quant_tables",
    "common_grid_bytes",
    "common_grid_u64",
    "kgrid_file",
    "ksigns_iq2xs",
    "load_kgrid",
    "quant_tables",
    "unpack_kgrid",
]

"""What the graph allocator decided: one record per placed tensor, the peaks, a table and a picture.

ggml keeps none of this (its plan is a hash table thrown away after reserve); pyggml keeps it
so a user can see why a buffer is as big as it is: which tensors were live together at the
peak, which ones reused a parent's memory in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import PyGGMLError


class PlotUnavailableError(PyGGMLError, ImportError):
    """Plotting a plan needs matplotlib (the ``plot`` extra)."""


@dataclass
class TensorRecord:
    """One tensor the allocator placed.

    ``first`` is the index of the node during whose allocation step the tensor got memory
    (-1: before the first node, as leafs and INPUT tensors are); ``last`` the index of the node
    after which its memory was released or handed on in place (``n_nodes - 1`` when it lives to
    the end: OUTPUT tensors, the last nodes, tensors nobody consumes).
    """

    name: str
    op: str
    buffer_id: int
    chunk: int
    offset: int
    size: int
    first: int
    last: int
    inplace_of: str | None = None
    flags: str = ""

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass
class Plan:
    """The result of the last reserve of a graph allocator."""

    n_nodes: int
    records: list[TensorRecord]
    #: chunk high-water marks per buffer id; buffer ids sharing a buffer type share one entry
    chunk_sizes: dict[int, list[int]]
    buffer_names: list[str]
    #: buffer id -> the buffer id whose chunk_sizes entry it shares (gallocr_new_n with repeated bufts)
    owner: dict[int, int] = field(default_factory=dict)

    def peak(self, buffer_id: int) -> int:
        """Planned bytes of a buffer (0 for an id that shares an earlier id's buffer)."""
        return sum(self.chunk_sizes.get(buffer_id, []))

    def live_at(self, step: int) -> list[TensorRecord]:
        """Records whose memory is in use while node ``step`` is computed."""
        return [r for r in self.records if r.first <= step <= r.last]

    def table(self) -> str:
        """A printable table of every placement and the peak of every buffer."""
        w = max([len(r.name) for r in self.records] + [4])
        head = (f"{'#':>4}  {'name':<{w}}  {'op':<14} {'buf':>3} {'chunk':>5} {'offset':>12} {'size':>12}"
                "  live     flags")
        lines = [head, "-" * len(head)]
        for i, r in enumerate(self.records):
            live = f"{r.first}..{r.last}"
            note = f"{r.flags}{' inplace of ' + r.inplace_of if r.inplace_of else ''}".strip()
            lines.append(f"{i:>4}  {r.name:<{w}}  {r.op:<14} {r.buffer_id:>3} {r.chunk:>5} {r.offset:>12} "
                         f"{r.size:>12}  {live:<8} {note}")
        lines.append("")
        for bid, sizes in sorted(self.chunk_sizes.items()):
            name = self.buffer_names[bid] if bid < len(self.buffer_names) else "?"
            lines.append(f"buffer {bid} ({name}): peak {sum(sizes)} bytes in {len(sizes)} chunk(s) {sizes}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def plot(self, path: str | Path, title: str | None = None) -> Path:
        """Save a picture of memory (y) over node index (x), each tensor a bar, to a PNG file."""
        try:  # matplotlib is optional (the test extra), loaded only to plot
            from matplotlib.figure import Figure
            from matplotlib.patches import Rectangle
        except ImportError as e:
            raise PlotUnavailableError("plotting an allocation plan needs matplotlib: "
                                       "pip install 'pyggml[plot]'") from e
        bids = sorted(self.chunk_sizes) or [0]
        fig = Figure(figsize=(10, 3 + 2.5 * len(bids)))
        axes = fig.subplots(len(bids), 1, squeeze=False)[:, 0]
        for ax, bid in zip(axes, bids, strict=True):
            sizes = self.chunk_sizes.get(bid, [])
            chunk_base = [sum(sizes[:c]) for c in range(len(sizes))]
            handed_on = {r.inplace_of for r in self.records if r.inplace_of}
            for r in self.records:
                if self._owner(r.buffer_id) != bid:
                    continue
                y = (chunk_base[r.chunk] if r.chunk < len(chunk_base) else 0) + r.offset
                # an in-place hand-over happens mid-step: the parent's bar stops where the child's starts
                x0 = r.first if r.inplace_of else r.first - 0.45
                x1 = r.last if r.name in handed_on else r.last + 0.45
                color = "tab:orange" if r.inplace_of else "tab:blue"
                ax.add_patch(Rectangle((x0, y), x1 - x0, max(r.size, 1), facecolor=color, edgecolor="black",
                                       linewidth=0.5, alpha=0.7))
                if self.n_nodes <= 40:
                    ax.text((x0 + x1) / 2, y + r.size / 2, r.name, ha="center", va="center", fontsize=6)
            for b in chunk_base[1:]:
                ax.axhline(b, color="red", linewidth=0.8, linestyle="--")
            ax.set_xlim(-1.5, max(self.n_nodes, 1) - 0.5)
            ax.set_ylim(0, max(self.peak(bid), 1))
            ax.set_xlabel("node index (-1: before the first node)")
            ax.set_ylabel("offset (bytes)")
            name = self.buffer_names[bid] if bid < len(self.buffer_names) else "?"
            ax.set_title(f"buffer {bid} ({name}): peak {self.peak(bid)} bytes")
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        out = Path(path)
        fig.savefig(out, dpi=120, format="png")
        return out

    def _owner(self, buffer_id: int) -> int:
        """The buffer id whose entry in chunk_sizes holds this id's memory."""
        return self.owner.get(buffer_id, buffer_id)

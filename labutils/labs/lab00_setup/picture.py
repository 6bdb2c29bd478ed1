"""Lab 00's picture of the first words: ranks in a process group, and what ``all_reduce`` (sum) does.

    from labutils.labs.lab00_setup import picture
    picture.all_reduce_picture(world_size=4)     # a matplotlib Figure (the notebook shows it)

Drawn by code from the ranks' values (rank r contributes r + 1), so the picture and the arithmetic
cannot disagree: the values before, the one sum every rank ends with after.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch


def _rank_box(ax, x: float, y: float, rank: int, value: float, color: str) -> None:
    ax.add_patch(FancyBboxPatch((x - 0.38, y - 0.28), 0.76, 0.56, boxstyle="round,pad=0.04",
                                facecolor=color, edgecolor="black", linewidth=1.2))
    ax.text(x, y + 0.1, f"rank {rank}", ha="center", va="center", fontsize=10, weight="bold")
    ax.text(x, y - 0.13, f"t = [{value:g}]", ha="center", va="center", fontsize=10, family="monospace")


def all_reduce_picture(world_size: int = 4, backend: str = "nccl or gloo") -> Figure:
    """``world_size`` ranks of one process group before and after ``dist.all_reduce(t)`` (op SUM),
    rank r holding ``t = [r + 1]`` before: every rank holds the same sum after.

    Raises:
        ValueError: ``world_size`` is not an int from 2 to 8 (a picture, not a plot).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or not 2 <= world_size <= 8:
        raise ValueError(f"world_size must be an int from 2 to 8 for this picture, got {world_size!r}.")
    before = [r + 1.0 for r in range(world_size)]
    total = sum(before)
    fig = Figure(figsize=(1.6 * world_size + 1.2, 4.2))
    ax = fig.add_subplot()
    ax.set_xlim(-0.9, world_size + 0.5)
    ax.set_ylim(-0.75, 3.25)
    ax.axis("off")
    y_before, y_mid, y_after = 2.6, 1.3, 0.0
    # the process group: one frame around the ranks, named with its size and backend
    ax.add_patch(FancyBboxPatch((-0.6, -0.5), world_size + 0.95, 3.5, boxstyle="round,pad=0.02",
                                facecolor="none", edgecolor="grey", linestyle="--"))
    ax.text(-0.55, 3.12, f"process group: world_size = {world_size}, backend = {backend}",
            fontsize=9, color="grey", va="center")
    centre = (world_size - 1) / 2
    ax.add_patch(FancyBboxPatch((centre - 0.9, y_mid - 0.22), 1.8, 0.44, boxstyle="round,pad=0.04",
                                facecolor="#fff2cc", edgecolor="black"))
    ax.text(centre, y_mid, " + ".join(f"{v:g}" for v in before) + f" = {total:g}",
            ha="center", va="center", fontsize=10, family="monospace")
    for r, v in enumerate(before):
        _rank_box(ax, r, y_before, r, v, "#dae8fc")
        _rank_box(ax, r, y_after, r, total, "#d5e8d4")
        for start, end in (((r, y_before - 0.34), (centre, y_mid + 0.28)),
                           ((centre, y_mid - 0.28), (r, y_after + 0.34))):
            ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12,
                                         color="black", linewidth=0.9))
    ax.text(world_size - 0.45, y_before, "before", ha="left", va="center", fontsize=9, style="italic")
    ax.text(world_size - 0.45, y_after, "after", ha="left", va="center", fontsize=9, style="italic")
    ax.set_title(f"dist.all_reduce(t) on {world_size} ranks: every rank contributes its t, "
                 "every rank gets the sum", fontsize=10)
    return fig

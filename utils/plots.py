"""Figures drawn the same way in every notebook: training curves and labelled heatmaps."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np


def use_course_style() -> None:
    """Readable defaults for notebooks and slides; PNG output keeps notebook files small."""
    plt.rcParams.update({
        "figure.figsize": (6.4, 3.6), "figure.dpi": 90, "axes.grid": True, "grid.alpha": 0.3,
        "axes.spines.top": False, "axes.spines.right": False, "font.size": 10,
    })
    try:  # store each figure once, as PNG (no duplicate SVG/PDF in the notebook)
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("png")
    except ImportError:
        pass


def smooth(values: Sequence[float], weight: float = 0.9) -> np.ndarray:
    """Exponential moving average with bias correction (as in TensorBoard's smoothing)."""
    out, avg = [], 0.0
    for i, v in enumerate(values, start=1):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight**i))
    return np.asarray(out)


def plot_history(history: dict[str, list[float]], keys: Sequence[str] = ("loss",),
                 title: str = "", ax=None):
    """One panel per metric name in `keys`, with its train_ and val_ curves against epochs."""
    if ax is None:
        _, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.4), squeeze=False)
        axes = axes[0]
    else:
        axes = [ax]
    for key, axis in zip(keys, axes):
        for split in ("train", "val"):
            values = history.get(f"{split}_{key}")
            if values:
                axis.plot(range(1, len(values) + 1), values, marker="o", label=split)
        axis.set(xlabel="epoch", ylabel=key, title=title or key)
        axis.legend()
    plt.tight_layout()
    return axes


def plot_curve(values: Sequence[float], xlabel: str = "step", ylabel: str = "loss",
               title: str = "", weight: float = 0.9, ax=None):
    """Raw values, faint, with their smoothed curve on top (training-health view)."""
    ax = ax or plt.subplots()[1]
    ax.plot(values, alpha=0.3, label="raw")
    ax.plot(smooth(values, weight), label=f"smoothed ({weight})")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend()
    return ax


def heatmap(matrix, xlabels: Sequence[str] | None = None, ylabels: Sequence[str] | None = None,
            xlabel: str = "", ylabel: str = "", title: str = "", cmap: str = "viridis",
            annotate: bool = False, ax=None):
    """A labelled heatmap (attention weights, similarities, confusion matrices)."""
    matrix = np.asarray(matrix, dtype=float)
    size = (min(0.5 * matrix.shape[1] + 2.5, 12), min(0.45 * matrix.shape[0] + 1.5, 10))  # capped
    ax = ax or plt.subplots(figsize=size)[1]
    image = ax.imshow(matrix, cmap=cmap, aspect="auto")
    ax.figure.colorbar(image, ax=ax)
    if xlabels is not None:
        ax.set_xticks(range(len(xlabels)), xlabels, rotation=60, ha="right")
    if ylabels is not None:
        ax.set_yticks(range(len(ylabels)), ylabels)
    if annotate:
        for (i, j), v in np.ndenumerate(matrix):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8,
                    color="white" if v < matrix.mean() else "black")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(False)
    return ax

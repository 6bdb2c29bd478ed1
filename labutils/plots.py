"""Plots for the labs. Every function returns a ``matplotlib.figure.Figure`` (no pyplot state).

Conventions: sizes on a log2 axis labelled in KiB/MiB/GiB; measured series as solid lines
with markers; models/fits dashed; the learner's prediction as a red star; hardware peaks as a
dotted horizontal line; the title says whether the data are live or recorded.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from .bandwidth import format_size


def _figure_png(fig: Figure) -> bytes:
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def _register_notebook_display() -> None:
    """Let IPython show a bare ``Figure`` returned by a cell as a PNG (pyplot is never used, so
    nothing is drawn twice and no global figure state piles up)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is not None:
        ip.display_formatter.formatters["image/png"].for_type(Figure, _figure_png)


_register_notebook_display()


def _size_axis(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_size(v)))
    ax.tick_params(axis="x", labelrotation=45)


def _prediction(ax, prediction, label="your prediction") -> None:
    if prediction is None:
        return
    pts = prediction if isinstance(prediction, (list, tuple)) and prediction and \
        isinstance(prediction[0], (list, tuple)) else [prediction]
    xs, ys = zip(*pts)
    ax.plot(xs, ys, "r*", markersize=16, label=label, zorder=5)


def bandwidth_plot(size_bytes: Sequence[float], series_gbps: Mapping[str, Sequence[float]], *,
                   fits: Mapping[str, object] | None = None, peak_gbps: float | None = None,
                   peak_label: str = "link peak", prediction=None, title: str = "",
                   ylabel: str = "bandwidth (GB/s)", logy: bool = False,
                   peaks: Mapping[str, float | None] | None = None) -> Figure:
    """Bandwidth vs message size.

    Args:
        size_bytes: x values (bytes), shared by the series.
        series_gbps: label -> GB/s values.
        fits: label -> object with ``predict_gbps(size)`` (e.g. ``bandwidth.AlphaBeta``), dashed.
        peak_gbps: hardware peak drawn as a dotted line.
        prediction: ``(size_bytes, gbps)`` or a list of them, drawn as red stars.
        peaks: more hardware ceilings, label -> GB/s (None values are skipped), drawn as dash-dot lines.
    """
    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for label, ys in series_gbps.items():
        ax.plot(size_bytes, ys, "o-", markersize=4, label=label)
    for label, fit in (fits or {}).items():
        xs = [s for s in size_bytes if s > 0]
        ax.plot(xs, [fit.predict_gbps(s) for s in xs], "--", label=f"fit {label}: {fit}")
    if peak_gbps:
        ax.axhline(peak_gbps, linestyle=":", color="k", label=f"{peak_label} {peak_gbps:.0f} GB/s")
    for (label, gbps), color in zip((peaks or {}).items(), ("0.45", "tab:brown", "tab:olive")):
        if gbps:
            ax.axhline(gbps, linestyle="-.", color=color, label=f"{label} {gbps:.0f} GB/s")
    _prediction(ax, prediction)
    _size_axis(ax)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("message size")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def time_plot(size_bytes: Sequence[float], series_ms: Mapping[str, Sequence[float]], *,
              fits: Mapping[str, object] | None = None, prediction=None, title: str = "") -> Figure:
    """Time vs message size on log-log axes (fits: objects with ``predict_ms(size)``)."""
    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for label, ys in series_ms.items():
        ax.plot(size_bytes, [y * 1e3 for y in ys], "o-", markersize=4, label=label)
    for label, fit in (fits or {}).items():
        ax.plot(size_bytes, [fit.predict_ms(s) * 1e3 for s in size_bytes], "--",
                label=f"fit {label}: {fit}")
    if prediction is not None:
        s, ms = prediction
        _prediction(ax, (s, ms * 1e3))
    _size_axis(ax)
    ax.set_yscale("log")
    ax.set_xlabel("message size")
    ax.set_ylabel("time (us)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def line_plot(x: Sequence[float], series: Mapping[str, Sequence[float]], *, xlabel: str,
              ylabel: str, title: str = "", logx: bool = False, logy: bool = False,
              dashed: Sequence[str] = (), prediction=None, hline: tuple | None = None) -> Figure:
    """Generic x/y plot. Labels listed in ``dashed`` are drawn as models (dashed, no markers);
    ``hline=(y, label)`` adds a dotted reference line."""
    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for label, ys in series.items():
        ax.plot(x, ys, "--" if label in dashed else "o-", markersize=4, label=label)
    if hline:
        ax.axhline(hline[0], linestyle=":", color="k", label=hline[1])
    _prediction(ax, prediction)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def bar_plot(labels: Sequence[str], values: Sequence[float], *, ylabel: str, title: str = "",
             annotate: str = "{:.3g}", errors: Sequence[float] | None = None) -> Figure:
    """Bars with their values written on top (``annotate`` is a format string, '' for none)."""
    fig = Figure(figsize=(7.5, 4.0), layout="constrained")
    ax = fig.add_subplot()
    bars = ax.bar(range(len(values)), values, yerr=errors, capsize=3 if errors else 0)
    ax.set_xticks(range(len(values)), labels, rotation=20, ha="right")
    if annotate:
        for b, v in zip(bars, values):
            ax.annotate(annotate.format(v), (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    return fig


def timeline_plot(spans: Sequence[Mapping], *, title: str = "", xlabel: str = "time (ms)") -> Figure:
    """Gantt chart: one lane per ``span["lane"]`` (e.g. "GPU 0 compute"), bars from ``start_ms`` to
    ``end_ms``, coloured by ``span.get("kind", lane)`` and labelled with ``span.get("label")``; the
    legend of the kinds sits below the chart, outside the bars."""
    lanes = list(dict.fromkeys(s["lane"] for s in spans))
    kinds = list(dict.fromkeys(s.get("kind", s["lane"]) for s in spans))
    fig = Figure(figsize=(8.5, 0.6 * len(lanes) + 1.9), layout="constrained")
    ax = fig.add_subplot()
    cmap = [f"C{i}" for i in range(10)]
    seen = set()
    for s in spans:
        y = lanes.index(s["lane"])
        kind = s.get("kind", s["lane"])
        color = cmap[kinds.index(kind) % 10]
        ax.barh(y, s["end_ms"] - s["start_ms"], left=s["start_ms"], height=0.6, color=color,
                edgecolor="k", linewidth=0.3, label=None if kind in seen else kind)
        seen.add(kind)
        if s.get("label"):
            ax.text((s["start_ms"] + s["end_ms"]) / 2, y, s["label"], ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    if len(kinds) > 1:  # below the chart, where it covers no bar
        handles, labels = ax.get_legend_handles_labels()
        fig.legend(handles, labels, fontsize=8, loc="outside lower center", ncols=min(len(kinds), 6))
    return fig


def source_label(*measurements) -> str:
    """Where the data of one plot come from, said once: ``"RECORDED 2026-11-29: 2x NVIDIA H200"`` for
    two recordings of one machine (not that label twice), ``"live: … / RECORDED …: …"`` for a mix.

    Args:
        measurements: ``recorded.Measurement`` objects (anything with ``live``, ``fingerprint`` and
            ``recorded_at``), in the order the plot shows them.
    """
    groups: dict[tuple[bool, str], list[str]] = {}
    for m in measurements:
        dates = groups.setdefault((bool(m.live), m.fingerprint.split(" | ")[0]), [])
        if m.recorded_at[:10] not in dates:
            dates.append(m.recorded_at[:10])
    return " / ".join(f"live: {hw}" if live else f"RECORDED {', '.join(dates)}: {hw}"
                      for (live, hw), dates in groups.items())

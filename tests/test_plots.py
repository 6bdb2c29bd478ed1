"""Plot helpers return Figures with the expected artists (no pyplot, no display)."""
from matplotlib.figure import Figure

from labutils import plots
from labutils.bandwidth import AlphaBeta


def test_bandwidth_plot_has_series_fit_peak_and_prediction():
    sizes = [2**k for k in range(10, 21)]
    fit = AlphaBeta(10, 100, 0.0)
    fig = plots.bandwidth_plot(sizes, {"a": [fit.predict_gbps(s) for s in sizes]}, fits={"a": fit},
                               peak_gbps=120, prediction=(2**20, 90), title="t")
    ax = fig.axes[0]
    labels = [l.get_label() for l in ax.get_lines()]
    assert isinstance(fig, Figure) and "a" in labels and any(l.startswith("fit a") for l in labels)
    assert "your prediction" in labels and any("120 GB/s" in l for l in labels)
    assert ax.get_xscale() == "log"


def test_bandwidth_plot_draws_more_peaks_and_skips_unknown_ones():
    fig = plots.bandwidth_plot([1024, 2048], {"a": [1.0, 2.0]}, peak_gbps=478.1, peak_label="line rate",
                               peaks={"data rate": 450.0, "PCIe": None})
    labels = [l.get_label() for l in fig.axes[0].get_lines()]
    assert "line rate 478 GB/s" in labels and "data rate 450 GB/s" in labels
    assert not any(l.startswith("PCIe") for l in labels)


def test_time_line_bar_timeline():
    figs = [plots.time_plot([1, 2, 4], {"x": [1, 2, 3]}, prediction=(2, 1.5)),
            plots.line_plot([1, 2], {"m": [1, 2], "model": [1, 2]}, xlabel="x", ylabel="y", dashed=["model"],
                            hline=(1.5, "ref")),
            plots.bar_plot(["a", "b"], [1.0, 2.0], ylabel="v"),
            plots.timeline_plot([{"lane": "GPU0", "start_ms": 0, "end_ms": 1, "kind": "compute", "label": "F0"},
                                 {"lane": "GPU1", "start_ms": 1, "end_ms": 2, "kind": "comm"}])]
    assert all(isinstance(f, Figure) for f in figs)
    assert [t.get_text() for t in figs[3].axes[0].get_yticklabels()] == ["GPU0", "GPU1"]
    assert len(figs[2].axes[0].texts) == 2  # annotated bars


def test_source_label_says_each_source_once():
    from labutils.recorded import Measurement
    hw = "2x NVIDIA H200 | NV18 | torch 2.11.0+cu130"
    a = Measurement("a", {}, False, hw, "2026-11-29T20:40:05+00:00")
    b = Measurement("b", {}, False, hw, "2026-11-29T21:00:00+00:00")
    c = Measurement("c", {}, False, hw, "2026-11-30T08:00:00+00:00")
    here = Measurement("d", {}, True, "1x NVIDIA L4 | torch 2.13.0", "2026-11-30T09:00:00+00:00")
    assert plots.source_label(a, b) == a.label == "RECORDED 2026-11-29: 2x NVIDIA H200"
    assert plots.source_label(a, c) == "RECORDED 2026-11-29, 2026-11-30: 2x NVIDIA H200"
    assert plots.source_label(here, a) == "live: 1x NVIDIA L4 / RECORDED 2026-11-29: 2x NVIDIA H200"
    assert plots.source_label(here) == here.label

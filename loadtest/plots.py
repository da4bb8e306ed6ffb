"""PNG plots for `--plot DIR`: latency CDFs of each load point, and throughput/latency against load for sweeps.

Uses matplotlib's non-interactive Agg backend, so it works on a headless machine. Returns the paths written.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from loadtest.records import RequestOutput


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_latency_cdfs(points: Sequence[tuple[str, Sequence[RequestOutput]]], out_dir: str | Path) -> Path:
    """latency_cdf.png: empirical CDFs of TTFT, TPOT, ITL and e2e (ms), one line per (label, outputs)."""
    plt = _plt()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = (
        ("TTFT (ms)", lambda ok: [o.ttft_s for o in ok]),
        ("TPOT (ms)", lambda ok: [t for o in ok if (t := o.tpot_s) is not None]),
        ("ITL per chunk (ms)", lambda ok: [x for o in ok for x in o.itl_s]),
        ("end-to-end latency (ms)", lambda ok: [o.e2e_s for o in ok]),
    )
    for ax, (title, pick) in zip(axes.flat, panels):
        for label, outputs in points:
            values = np.sort(np.asarray(pick([o for o in outputs if o.success]), dtype=float)) * 1000
            if values.size:
                ax.plot(values, np.arange(1, values.size + 1) / values.size, label=label)
        ax.set_xlabel(title)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize="small")
    fig.tight_layout()
    path = out_dir / "latency_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sweep(reports: Sequence[dict], sweep_over: str, out_dir: str | Path) -> list[Path]:
    """throughput_vs_load.png and latency_vs_load.png over the swept value (request rate or concurrency)."""
    plt = _plt()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    x = [float(r[sweep_over]) if r[sweep_over] != "inf" else float("inf") for r in reports]
    xlabel = "offered request rate (req/s)" if sweep_over == "request_rate" else "max concurrency (requests)"

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(x, [r["request_throughput"] for r in reports], "o-", label="request throughput (req/s)")
    if all(r.get("request_goodput") is not None for r in reports):
        ax.plot(x, [r["request_goodput"] for r in reports], "s--", label="goodput (req/s)")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("requests/s")
    ax2 = ax.twinx()
    ax2.plot(x, [r["output_throughput"] for r in reports], "^:", color="tab:green", label="output tokens/s")
    ax2.set_ylabel("output tokens/s")
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(lines, [str(line.get_label()) for line in lines], fontsize="small", loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    p1 = out_dir / "throughput_vs_load.png"
    fig.savefig(p1, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, style in (("ttft", "o-"), ("tpot", "s-"), ("e2el", "^-")):
        ax.plot(x, [r[f"median_{key}_ms"] for r in reports], style, label=f"median {key.upper()}")
        if all(f"p99_{key}_ms" in r for r in reports):
            ax.plot(
                x,
                [r[f"p99_{key}_ms"] for r in reports],
                style.replace("-", "--"),
                alpha=0.6,
                label=f"p99 {key.upper()}",
            )
    ax.set_xlabel(xlabel)
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    p2 = out_dir / "latency_vs_load.png"
    fig.savefig(p2, dpi=110)
    plt.close(fig)
    return [p1, p2]

"""`--plot DIR`: the PNGs are written and are PNGs."""

from loadtest import plots
from loadtest.records import RequestOutput

PNG = b"\x89PNG\r\n\x1a\n"


def test_latency_cdfs_and_sweep_plots(tmp_path):
    outs = [
        RequestOutput(success=True, ttft_s=0.01 * i, e2e_s=0.1 + 0.01 * i, itl_s=[0.005], output_tokens=3)
        for i in range(1, 20)
    ]
    p = plots.plot_latency_cdfs([("a", outs), ("b", outs[:5]), ("empty", [])], tmp_path)
    assert p.read_bytes()[:8] == PNG
    reps = [
        {
            "request_rate": r,
            "request_throughput": r * 0.9,
            "request_goodput": r * 0.5,
            "output_throughput": r * 100,
            **{f"{s}_{m}_ms": r for s in ("median", "p99") for m in ("ttft", "tpot", "e2el")},
        }
        for r in (1.0, 2.0, 4.0)
    ]
    paths = plots.plot_sweep(reps, "request_rate", tmp_path / "sweep")
    assert [x.name for x in paths] == ["throughput_vs_load.png", "latency_vs_load.png"]
    assert all(x.read_bytes()[:8] == PNG for x in paths)

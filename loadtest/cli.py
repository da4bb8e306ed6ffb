r"""`python -m loadtest`: load-test an OpenAI-compatible server or DeepSpec's gRPC API.

Runbook (the server is the embedded DeepSpec service, `python -m service`, unless said otherwise):

  # 200 chat requests from the eval datasets, 16 at a time (closed loop), with a JSON report
  python -m loadtest --backend openai-chat --max-concurrency 16 --num-prompts 200 --result-file draft.json

  # Poisson arrivals at 4 req/s for 60 s, goodput against an SLO, plots
  python -m loadtest --request-rate 4 --duration 60 --slo ttft=500,tpot=50 --plot plots/

  # bursty arrivals (gamma, burstiness 0.5), random prompts of ~512 tokens, exactly 128 output tokens each
  python -m loadtest --request-rate 8 --burstiness 0.5 --dataset-name random --random-input-len 512 \
      --random-output-len 128 --ignore-eos --num-prompts 500

  # sweep: one command, one report with a run per rate (or --max-concurrency 1,4,16,64)
  python -m loadtest --request-rate 1,2,4,8,16 --num-prompts 200 --result-file sweep.json --plot plots/

  # our gRPC API (spec-decode counters still come from the gateway's HTTP /metrics)
  python -m loadtest --backend grpc --grpc-address 127.0.0.1:50051 --max-concurrency 8 --num-prompts 100

  # draft vs no draft: run twice (restart the server without a draft in between), then
  python -m loadtest --compare nodraft.json draft.json

  # small CPU dry run with no model: a fake server in one shell, the load tester in another
  python -m loadtest --fake-server 127.0.0.1:8000 --fake-ttft-ms 20 --fake-itl-ms 5
  python -m loadtest --dataset-name random --random-input-len 32 --random-output-len 16 --max-concurrency 8 \
      --num-prompts 100

Ctrl-C stops sending, cancels the requests in flight and still prints and writes the partial report; a second
Ctrl-C quits at once. Exit status: 0 when requests succeeded, 1 when every measured request failed, 2 for usage
errors, 130 when interrupted.

This module parses arguments, prints and renders the live display; everything it calls is a library that does
neither.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loadtest.arrivals import LoadPoint

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_GRPC_ADDRESS = "127.0.0.1:50051"

METRICS_HELP = """\
metrics (all latencies in ms, reported as mean / median / std / the --percentiles):
  TTFT  time to first token: request sent -> first response chunk carrying output text
  ITL   inter-token latency: gap between successive output-carrying chunks (a chunk may carry several
        tokens under speculative decoding, so this is per chunk)
  TPOT  time per output token: (e2e - TTFT) / (output tokens - 1); requests with < 2 tokens are left out
  E2EL  end-to-end latency: request sent -> last byte of the response
  request / output-token throughput: successful requests (their output tokens) / duration, where
        duration = first measured send -> last measured response (warm-up requests excluded)
  goodput: successful requests meeting every --slo limit, per second of duration
  output tokens: the server's usage.completion_tokens (requested with stream_options.include_usage),
        else the number of output-carrying chunks
  spec decode: diff of the server's deepspec:spec_decode_* counters at --metrics-url before and after
        the run: acceptance rate = accepted / draft tokens, mean acceptance length = 1 + accepted / drafts
"""


def _float_list(text: str) -> list[float]:
    try:
        values = [math.inf if v.strip().lower() == "inf" else float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number, 'inf' or a comma list such as 1,2,4; got {text!r}"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"rates must be > 0 req/s; got {text!r}")
    return values


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or a comma list such as 1,4,16; got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"concurrency must be >= 1; got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtest",
        description=(__doc__ or "").split("\n\nThis module")[0],
        epilog=METRICS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_endpoint_args(p)
    _add_load_args(p)
    _add_workload_args(p)
    _add_results_args(p)
    _add_other_mode_args(p)
    return p


def _add_endpoint_args(p: argparse.ArgumentParser) -> None:
    """Where the requests go and how each one is sent."""
    g = p.add_argument_group("endpoint")
    g.add_argument(
        "--backend",
        choices=["openai", "openai-chat", "grpc"],
        default="openai-chat",
        help="openai = POST /v1/completions, openai-chat = POST /v1/chat/completions, "
        "grpc = deepspec.v1.Completions (default: %(default)s)",
    )
    g.add_argument("--base-url", default=DEFAULT_BASE_URL, help="HTTP server root (default: %(default)s)")
    g.add_argument(
        "--grpc-address", default=DEFAULT_GRPC_ADDRESS, help="host:port of the gRPC API (default: %(default)s)"
    )
    g.add_argument(
        "--model",
        default=None,
        help="model name sent with each request (default: the first id of "
        "GET /v1/models; empty for gRPC = the served model)",
    )
    g.add_argument(
        "--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token (default: $OPENAI_API_KEY)"
    )
    g.add_argument("--no-stream", action="store_true", help="ask for whole responses; TTFT then equals e2e latency")
    g.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="per-request limit in seconds (default: %(default)s)",
    )
    g.add_argument(
        "--metrics-url",
        default=None,
        help="Prometheus text for spec-decode counters (default: BASE_URL/metrics; 'off' to skip)",
    )


def _add_load_args(p: argparse.ArgumentParser) -> None:
    """How many requests, how fast and how many at once; a comma list makes a sweep."""
    g = p.add_argument_group("load (a comma list in one of --request-rate / --max-concurrency makes a sweep)")
    g.add_argument(
        "--request-rate",
        type=_float_list,
        default=[math.inf],
        metavar="REQ_PER_S",
        help="open-loop arrival rate in requests/s, e.g. 4 or 1,2,4,8; 'inf' (default) sends all at once, "
        "or, with --max-concurrency, runs a closed loop",
    )
    g.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of the inter-arrival gaps: 1 = Poisson "
        "(default), < 1 burstier, > 1 more regular; mean rate unchanged",
    )
    g.add_argument(
        "--max-concurrency",
        type=_int_list,
        default=None,
        metavar="N",
        help="requests in flight at most, e.g. 16 or 1,4,16,64; with rate inf a closed loop of N; "
        "also the connection pool size (default: unbounded)",
    )
    g.add_argument(
        "--num-prompts",
        type=int,
        default=None,
        help="measured requests per load point (default: 1000, or unbounded when --duration is given)",
    )
    g.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop sending after this many seconds per load point; requests in flight finish",
    )
    g.add_argument(
        "--num-warmups",
        type=int,
        default=0,
        help="requests sent before each measured run and left out "
        "of every number (default: %(default)s; 8-32 is typical)",
    )
    g.add_argument("--seed", type=int, default=0, help="seed for arrivals, prompt order and random prompts")


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    """Which prompts are sent and how long their answers may be."""
    from loadtest.workload import DEFAULT_EVAL_DIR

    g = p.add_argument_group("workload")
    g.add_argument(
        "--dataset-name",
        choices=["eval", "random"],
        default="eval",
        help="eval = first turns of {'turns': [...]} jsonl records; random = random words (default: %(default)s)",
    )
    g.add_argument(
        "--dataset-path",
        default=str(DEFAULT_EVAL_DIR),
        help="a .jsonl file or a directory of them (default: %(default)s)",
    )
    g.add_argument(
        "--max-tokens", type=int, default=256, help="max output tokens per eval request (default: %(default)s)"
    )
    g.add_argument(
        "--random-input-len", type=int, default=1024, help="random prompt length, ~tokens (default: %(default)s)"
    )
    g.add_argument("--random-output-len", type=int, default=128, help="random max output tokens (default: %(default)s)")
    g.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="lengths uniform in len*(1 +- ratio), 0 <= ratio < 1 (default: %(default)s)",
    )
    g.add_argument(
        "--ignore-eos",
        action="store_true",
        help="send ignore_eos so every request makes max tokens (vLLM/DeepSpec extension; OpenAI itself rejects it)",
    )
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 = greedy (default)")


def _add_results_args(p: argparse.ArgumentParser) -> None:
    """What is reported and where it is written."""
    g = p.add_argument_group("results")
    g.add_argument(
        "--slo",
        default=None,
        metavar="ttft=MS,tpot=MS,e2e=MS",
        help="latency limits in ms for goodput, e.g. ttft=500,tpot=50; any subset",
    )
    g.add_argument("--percentiles", default="90,99", help="percentiles to report (default: %(default)s)")
    g.add_argument("--result-file", default=None, metavar="PATH.json", help="write the JSON report here")
    g.add_argument(
        "--save-detailed", action="store_true", help="add per-request arrays (ttfts, itls, lens, texts, errors)"
    )
    g.add_argument("--label", default=None, help="name of this run in the report and in --compare (e.g. 'draft')")
    g.add_argument(
        "--plot", default=None, metavar="DIR", help="write latency CDF PNGs (and throughput vs load for sweeps)"
    )
    g.add_argument(
        "--quiet", action="store_true", help="no live progress display (it is off anyway when stderr is not a TTY)"
    )
    g.add_argument("--plan", action="store_true", help="print the load points and workload, send nothing")


def _add_other_mode_args(p: argparse.ArgumentParser) -> None:
    """Modes that send no load: comparing two reports, serving a fake endpoint."""
    g = p.add_argument_group("other modes")
    g.add_argument(
        "--compare", nargs=2, metavar=("A.json", "B.json"), help="print A and B side by side with B/A ratios"
    )
    g.add_argument(
        "--fake-server",
        metavar="HOST:PORT",
        help="serve a fake OpenAI-compatible endpoint with fixed "
        "latencies until Ctrl-C (for dry runs and for measuring this tool)",
    )
    g.add_argument("--fake-ttft-ms", type=float, default=0.0, help="fake server: time to first chunk, ms")
    g.add_argument("--fake-itl-ms", type=float, default=0.0, help="fake server: gap between chunks, ms")
    g.add_argument(
        "--fake-tokens-per-chunk",
        type=int,
        default=1,
        help="fake server: tokens per chunk (>1 imitates speculative decoding)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.compare:
        return _compare(args.compare)
    if args.fake_server:
        return _fake_server(args, parser)
    try:
        return _benchmark(args, parser)
    except KeyboardInterrupt:  # the second Ctrl-C: quit without a report
        print("aborted", file=sys.stderr)
        return 130


def _compare(paths: list[str]) -> int:
    from rich.console import Console
    from rich.table import Table

    from loadtest.compare import compare_reports, load_report

    try:
        a, b = (load_report(p) for p in paths)
        tables = compare_reports(a, b)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    name_a = a.get("label") or paths[0]
    name_b = b.get("label") or paths[1]
    console = Console()
    for title, rows in tables:
        t = Table(title=title)
        t.add_column("metric")
        t.add_column(f"A: {name_a}", justify="right")
        t.add_column(f"B: {name_b}", justify="right")
        t.add_column("B/A", justify="right")
        for r in rows:
            ratio = "-" if r.ratio is None else f"{r.ratio:.3f}x"
            if r.b_better is not None:
                ratio = f"[{'green' if r.b_better else 'red'}]{ratio}[/]"
            t.add_row(r.label, _fmt(r.a), _fmt(r.b), ratio)
        console.print(t)
    return 0


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:,.3f}" if abs(v) < 100 else f"{v:,.1f}"


def _fake_server(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:

    from loadtest.fake_server import FakeServerConfig, serve_forever

    host, _, port = args.fake_server.rpartition(":")
    if not host or not port.isdigit():
        parser.error(f"--fake-server wants HOST:PORT, e.g. 127.0.0.1:8000; got {args.fake_server!r}")
    cfg = FakeServerConfig(
        ttft_s=args.fake_ttft_ms / 1000, itl_s=args.fake_itl_ms / 1000, tokens_per_chunk=args.fake_tokens_per_chunk
    )
    print(
        f"fake OpenAI server on http://{host}:{port} (TTFT {args.fake_ttft_ms:g} ms, ITL {args.fake_itl_ms:g} ms); "
        "Ctrl-C stops it",
        file=sys.stderr,
    )
    try:
        _event_loop_runner()(serve_forever(cfg, host, int(port)))
    except KeyboardInterrupt:
        pass
    return 0


def _event_loop_runner():
    """uvloop when installed (it roughly halves the client's CPU per request), else asyncio."""
    import asyncio

    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return lambda coro: (
        asyncio.run(coro, loop_factory=uvloop.new_event_loop) if sys.version_info >= (3, 12) else uvloop.run(coro)
    )


@dataclass(frozen=True, slots=True)
class _Plan:
    """The validated load: what `--plan` prints and what the run sends."""

    points: list[LoadPoint]
    num_prompts: int | None
    slo: dict[str, float] | None
    percentiles: list[float]
    #: the option a sweep varies ("request_rate" / "max_concurrency"), None for a single load point.
    sweep_over: str | None


def _benchmark(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    plan = _validated_plan(args, parser)
    try:
        requests = _workload(args)
    except (OSError, ValueError) as e:
        parser.error(str(e))
    metrics_url = _metrics_url(args)
    target = args.grpc_address if args.backend == "grpc" else args.base_url
    if args.plan:
        _print_plan(args, plan, target, metrics_url)
        return 0

    from loadtest.report import format_summary, format_sweep_table, point_report

    model = _served_model(args)
    meta = _report_meta(args, target, model, plan.num_prompts)
    results, interrupted = _event_loop_runner()(
        _run_points(args, plan.points, requests, model, plan.num_prompts, metrics_url)
    )
    reports = [
        point_report(r, meta=meta, slo=plan.slo, percentiles=plan.percentiles, detailed=args.save_detailed)
        for r in results
    ]
    for r in reports:
        print(format_summary(r, plan.percentiles))
    if plan.sweep_over and len(reports) > 1:
        print(f"Sweep over {plan.sweep_over}:")
        print(format_sweep_table(reports, plan.sweep_over))
    if args.result_file and reports:
        _write_report(args.result_file, reports, plan.sweep_over)
    if args.plot and results:
        _write_plots(args.plot, results, reports, plan.sweep_over)
    if interrupted:
        return 130
    return 0 if any(r["completed"] for r in reports) else 1


def _validated_plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> _Plan:
    """Check the options that argparse cannot check alone; a bad one exits with a usage error (status 2)."""
    from loadtest.arrivals import LoadPoint
    from loadtest.metrics import parse_slo

    rates, concs = args.request_rate, args.max_concurrency or [None]
    if len(rates) > 1 and len(concs) > 1:
        parser.error("sweep over --request-rate or --max-concurrency, not both")
    if args.num_prompts is not None and args.num_prompts < 1:
        parser.error("--num-prompts must be >= 1")
    if args.duration is not None and args.duration <= 0:
        parser.error("--duration must be > 0 seconds")
    if args.num_warmups < 0:
        parser.error("--num-warmups must be >= 0")
    num_prompts = args.num_prompts if args.num_prompts or args.duration else 1000
    try:
        slo = parse_slo(args.slo) if args.slo else None
        percentiles = [float(x) for x in args.percentiles.split(",") if x.strip()]
        if not all(0 < q < 100 for q in percentiles):
            raise ValueError(f"--percentiles must be in (0, 100), got {args.percentiles!r}")
        points = [LoadPoint(r, args.burstiness, c) for r in rates for c in concs]
    except ValueError as e:
        parser.error(str(e))
    sweep_over = "request_rate" if len(rates) > 1 else "max_concurrency" if len(concs) > 1 else None
    return _Plan(points, num_prompts, slo, percentiles, sweep_over)


def _metrics_url(args: argparse.Namespace) -> str | None:
    """The spec-decode counters' URL: --metrics-url, else the server's /metrics; None when 'off'."""
    if (args.metrics_url or "").lower() == "off":
        return None
    return args.metrics_url or args.base_url.rstrip("/") + "/metrics"


def _print_plan(args: argparse.Namespace, plan: _Plan, target: str, metrics_url: str | None) -> None:
    bound = " and ".join(
        x
        for x in (
            f"{plan.num_prompts} requests" if plan.num_prompts else "",
            f"{args.duration:g} s" if args.duration else "",
        )
        if x
    )
    workload = f"workload {args.dataset_name}; bound {bound}; warm-up {args.num_warmups}"
    print(f"backend {args.backend} at {target}; {workload}")
    for pt in plan.points:
        print(f"  {pt.describe()}")
    print(f"spec-decode counters: {metrics_url or 'off'}")


def _served_model(args: argparse.Namespace) -> str | None:
    """--model, else the first id the HTTP server lists; a server that cannot list gets no 'model' field (a warning)."""
    if args.model is not None or args.backend == "grpc":
        return args.model
    import asyncio

    from loadtest.clients.openai_http import fetch_model_ids

    try:
        ids = asyncio.run(fetch_model_ids(args.base_url, api_key=args.api_key))
    except Exception as e:
        print(
            f"warning: could not list models at {args.base_url}/v1/models ({type(e).__name__}: {e}); "
            "sending no 'model' field; pass --model NAME",
            file=sys.stderr,
        )
        return None
    return ids[0] if ids else None


def _report_meta(args: argparse.Namespace, target: str, model: str | None, num_prompts: int | None) -> dict:
    """The run's settings, copied into every point's report."""
    return {
        "backend": args.backend,
        "endpoint": {"openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}.get(
            args.backend, "deepspec.v1.Completions"
        ),
        "base_url": target,
        "model_id": model,
        "tokenizer_id": None,
        "label": args.label,
        "dataset_name": args.dataset_name,
        "num_prompts": num_prompts,
        "duration_limit_s": args.duration,
        "stream": not args.no_stream,
    }


def _write_report(result_file: str, reports: list[dict], sweep_over: str | None) -> None:
    """One point's report, or a sweep report holding every point's, as JSON at `result_file`."""
    import json
    from pathlib import Path

    from loadtest.report import sweep_report

    doc = sweep_report(reports, sweep_over) if sweep_over else reports[0]
    path = Path(result_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"report: {path}")


def _write_plots(plot_dir: str, results: list, reports: list[dict], sweep_over: str | None) -> None:
    """Latency CDFs of every point, and throughput against load when a sweep ran more than one point."""
    from loadtest import plots

    labels = [r.point.describe() for r in results]
    written = [plots.plot_latency_cdfs(list(zip(labels, (r.run.outputs for r in results))), plot_dir)]
    if sweep_over and len(reports) > 1:
        written += plots.plot_sweep(reports, sweep_over, plot_dir)
    print("plots: " + ", ".join(str(p) for p in written))


def _workload(args: argparse.Namespace):
    from loadtest import workload

    if args.dataset_name == "random":
        return workload.random_requests(
            input_len=args.random_input_len,
            output_len=args.random_output_len,
            range_ratio=args.random_range_ratio,
            seed=args.seed,
            ignore_eos=args.ignore_eos,
            temperature=args.temperature,
        )
    prompts = workload.load_turns(args.dataset_path)
    return workload.dataset_requests(
        prompts, max_tokens=args.max_tokens, ignore_eos=args.ignore_eos, seed=args.seed, temperature=args.temperature
    )


async def _run_points(args, points, requests, model, num_prompts, metrics_url):
    """Run each load point in turn under one event loop; Ctrl-C ends the current point and the sweep."""
    import asyncio
    import signal

    from loadtest.clients import make_client
    from loadtest.live import LiveDisplay
    from loadtest.runner import Progress, run_point

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_sigint() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)  # a second Ctrl-C raises KeyboardInterrupt as usual

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    except (NotImplementedError, RuntimeError):  # not the main thread (tests) or no signals on this platform
        pass

    def client_for(pool_size: int):
        return make_client(
            args.backend,
            base_url=args.base_url,
            grpc_address=args.grpc_address,
            model=model,
            stream=not args.no_stream,
            pool_size=pool_size,
            timeout_s=args.timeout,
            api_key=args.api_key,
        )

    progress = Progress()
    display = LiveDisplay(progress, enabled=not args.quiet and sys.stderr.isatty())
    results = []
    with display:
        for i, pt in enumerate(points):
            display.title = f"[{i + 1}/{len(points)}] {pt.describe()}"
            results.append(
                await run_point(
                    client_for,
                    requests,
                    pt,
                    num_requests=num_prompts,
                    duration_s=args.duration,
                    num_warmups=args.num_warmups,
                    metrics_url=metrics_url,
                    seed=args.seed + i,
                    stop=stop,
                    progress=progress,
                )
            )
            if stop.is_set():
                break
    return results, stop.is_set()

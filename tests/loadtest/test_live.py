"""The live progress line shows the runner's counters."""


def test_live_line_renders_progress():
    from rich.console import Console

    from loadtest.live import LiveDisplay
    from loadtest.runner import Progress

    p = Progress()
    p.reset("run", 100, None)
    p.completed, p.failed, p.in_flight, p.output_tokens = 40, 2, 8, 640
    console = Console(width=200, record=True)
    console.print(LiveDisplay(p, enabled=False))
    line = console.export_text()
    assert "42/100 done" in line and "2 failed" in line and "8 in flight" in line and "ETA" in line

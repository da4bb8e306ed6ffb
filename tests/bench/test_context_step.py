"""bench.context_step: its table's arithmetic, and a short run of the real decoders that writes every cell."""

from __future__ import annotations

import json

from bench import context_step


def test_the_table_divides_llama_cpp_by_the_native_step_at_each_position():
    rows = {
        "native B=1": {128: 4.0, 1024: 5.0},
        "native B=8": {128: 9.0, 1024: 14.0},
        "llama.cpp B=1": {128: 8.0, 1024: 15.0},
    }
    text = context_step.table(rows, [128, 1024])
    assert "| native B=8 ms | 9.00 | 14.00 |" in text
    assert "| llama.cpp / native B=1 | 2.00x | 3.00x |" in text
    assert "llama.cpp /" not in context_step.table({"native B=1": {128: 4.0}}, [128])


def test_a_short_run_times_every_row_at_every_position(tmp_path):
    out = tmp_path / "context.json"
    assert context_step.main(["--positions", "8,24", "--repeats", "1", "--threads", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {"native B=1", "native B=8"} <= set(report["ms"])
    for times in report["ms"].values():
        assert set(times) == {"8", "24"} and all(ms > 0 for ms in times.values())

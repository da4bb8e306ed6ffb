"""bench.onnx_decode's step-curve arithmetic and table: the ratios every verify-step claim in export/DESIGN.md
rests on."""

from __future__ import annotations

from rich.console import Console

from bench.onnx_decode import STEP_SIZES, curve_summary, curve_table, identical_to_own_target_only


def _render(table) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def test_curve_summary_divides_by_the_one_token_step():
    curve = curve_summary({n: 0.010 * (1 + n / 8) for n in STEP_SIZES})
    assert curve["1"] == {"ms": 11.25, "x_one_token": 1.0}
    assert curve["8"]["x_one_token"] == round(0.020 / 0.01125, 2)


def test_curve_table_has_a_row_per_method_with_ratios_and_cpu_time():
    wall = {
        "int4": curve_summary({n: 0.010 * n for n in STEP_SIZES}),
        "llama.cpp": curve_summary({n: 0.014 for n in STEP_SIZES}),
    }
    cpu = {name: curve_summary({n: 0.002 * n for n in STEP_SIZES}) for name in wall}
    text = _render(curve_table("steps", wall))
    assert "320.0 (32.00x)" in text and "14.0 (1.00x)" in text and " / " not in text
    with_cpu = _render(curve_table("steps", wall, cpu))
    assert "80.0 / 16.0 (8.00x)" in with_cpu


def test_a_drafted_row_is_compared_with_its_own_target_only_row():
    rows = {
        "onnx-int8": {"gsm8k": [([1, 2, 3], 1.0), ([4, 5], 1.0)]},
        "onnx-int8+corpus": {"gsm8k": [([1, 2, 3], 0.5, 2.0), ([4, 6], 0.5, 2.0)]},
        "onnx-int8:exact": {"gsm8k": [([1, 2, 4], 1.0)]},
        "onnx-int8:exact+corpus": {"gsm8k": [([1, 2, 4], 0.5, 2.0)]},
        "served:onnx-int8+corpus": {"gsm8k": [([1, 2, 3], 0.5, 2.0)]},
        "llama.cpp+prompt-lookup": {"gsm8k": [([1, 2, 3], 0.5, None)]},
        "llama.cpp": {"gsm8k": [([1, 2, 3], 0.5, None)]},
    }
    assert identical_to_own_target_only(rows) == {
        "onnx-int8+corpus": {"gsm8k": "1/2"},
        "onnx-int8:exact+corpus": {"gsm8k": "1/1"},
    }

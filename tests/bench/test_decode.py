"""bench.decode: tree rows next to chain rows (the default draft's other shape), and verify tokens per step in
the results, on a tiny target with the peers skipped."""

from __future__ import annotations

import json
from types import SimpleNamespace

from bench.decode import main, shape_variants, summarize
from tests.training.helpers import tiny_hf_target_dir


def test_shape_variants_add_only_the_other_shape(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"algo": "corpus-lookup"}))
    built, made = [], []

    def build(base, target, **options):
        built.append(options)
        made.append(SimpleNamespace(tree=options["tree"]))
        return made[-1]

    rows = shape_variants(str(tmp_path), SimpleNamespace(tree=False), None, build)
    assert built == [{"tree": False}, {"tree": True}]
    assert rows == [("[tree]", made[1])] and made[1].tree is True
    rows = shape_variants(str(tmp_path), SimpleNamespace(tree=True), None, build)
    assert [suffix for suffix, _ in rows] == ["[chain]"]


def test_shape_variants_skip_a_drafter_without_tree_options(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"algo": "eagle3"}))

    def build(base, target, **options):
        raise TypeError("__init__() got an unexpected keyword argument 'tree_branches'")

    assert shape_variants(str(tmp_path), SimpleNamespace(tree=None), None, build) == []
    assert "tree_branches" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({"algo": "medusa"}))
    assert shape_variants(str(tmp_path), SimpleNamespace(tree=None), None, build) == []


def test_summarize_reports_verify_tokens_per_step():
    rows = {"d": [([1, 2], 1.0, 2.0, 6.0), ([3], 1.0, 1.0, 4.0)], "peer": [([1, 2], 0.5, None)]}
    out = summarize(rows, {})
    assert out["d"]["verify_tokens_per_step"] == 5.0 and out["d"]["acceptance_length"] == 1.5
    assert out["peer"]["verify_tokens_per_step"] is None


def test_summarize_says_how_far_outputs_follow_the_reference():
    """A drifting (quantized) output shares a long prefix with the reference, a broken one almost none: the column
    that would have flagged an int8 graph decoding gibberish while its 'identical' count read 0/5 like int4's."""
    ref = [([1, 2, 3, 4], 1.0, None), ([5, 6, 7], 1.0, None), ([8, 9], 1.0, None)]
    drift = summarize({"ds": [([1, 2, 3, 0], 1.0, None), ([5, 6, 7], 1.0, None), ([8, 0], 1.0, None)]}, {"ds": ref})
    broken = summarize({"ds": [([0, 2, 3, 4], 1.0, None), ([5, 0, 7], 1.0, None), ([0], 1.0, None)]}, {"ds": ref})
    assert drift["ds"]["identical_to_reference"] == "1/3" and drift["ds"]["median_common_prefix"] == 3
    assert broken["ds"]["identical_to_reference"] == "0/3" and broken["ds"]["median_common_prefix"] == 0


def test_bench_rows_carry_shape_and_verify_width(tmp_path, monkeypatch):
    target_dir = tiny_hf_target_dir(tmp_path / "target")
    (tmp_path / "data" / "eval").mkdir(parents=True)
    for name in ("humaneval", "gsm8k", "mbpp"):
        (tmp_path / "data" / "eval" / f"{name}.jsonl").write_text(json.dumps({"turns": ["add 1 and 2 and 1"]}) + "\n")
    monkeypatch.setenv("DEEPSPEC_DATASETS_DIR", str(tmp_path / "data"))
    out = tmp_path / "decode.json"
    code = main(
        [
            "--target",
            str(target_dir),
            "--dtype",
            "float32",
            "--num-prompts",
            "1",
            "--max-tokens",
            "6",
            "--drafters",
            "prompt-lookup",
            "--trees",
            "default",
            "--skip",
            "hf-generate,hf-prompt-lookup,llama.cpp,llama.cpp+prompt-lookup",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    results = report["results"]
    assert report["machine"]["cpu_flags"] and report["machine"]["llama_cpp_build"] is None  # no peer row ran
    row = results["engine+prompt-lookup"]["gsm8k"]
    assert row["shape"] == "chain" and row["verify_tokens_per_step"] >= 1.0
    assert results["engine"]["gsm8k"]["verify_tokens_per_step"] is None


def test_engine_decoder_samples_seeded_at_a_temperature_and_is_greedy_by_default():
    """`--temperature` rows: a fixed seed, so two decoders of the same target draw the same tokens, and a greedy
    decoder gives the argmax continuation whatever the seed."""
    from bench.decode import engine_decoder
    from tests.training.helpers import tiny_target

    target = tiny_target()
    prompt = [1, 2, 3, 4]
    greedy = engine_decoder(target, None, 12, 0, prompt)(prompt)[0]
    sampled = [engine_decoder(target, None, 12, 0, prompt, temperature=1.0)(prompt)[0] for _ in range(2)]
    assert sampled[0] == sampled[1] and len(sampled[0]) == 12
    assert sampled[0] != greedy  # the temperature reached the engine (a random tiny model, seeded: deterministic)
    assert engine_decoder(target, None, 12, 0, prompt)(prompt)[0] == greedy

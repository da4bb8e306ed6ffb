"""eval: reports (eval.json, eval.md, acceptance.png), identity with target-only under greedy, shared baseline
for several drafts, and the metric arithmetic."""

from __future__ import annotations

import json

import pytest

from deepspec.decoding.params import GenerationResult
from deepspec.models import load_target
from deepspec.models.drafts import save_draft
from tests.training.helpers import tiny_draft, tiny_hf_target_dir
from training.__main__ import main
from training.evaluate import summarize


def test_summarize_counts_bonus_and_survival():
    r = GenerationResult(
        "a",
        [1],
        num_steps=4,
        num_drafted_steps=4,
        num_draft_tokens=12,
        num_accepted_tokens=6,
        accepted_per_position=[3, 2, 1],
        proposed_per_position=[4, 4, 4],
    )
    tau, verify_rate, survival = summarize([r])
    assert tau == (6 + 4) / 4 and verify_rate == 10 / 16
    assert survival == [0.75, 0.5, 0.25]


def test_summarize_pools_requests_and_leaves_undrafted_rounds_out_of_tau():
    # a: 4 rounds, 2 drafted (3 drafts each, 4 accepted); b: 2 rounds, none drafted (the budget cut both)
    a = GenerationResult(
        "a",
        [1],
        num_steps=4,
        num_drafted_steps=2,
        num_draft_tokens=6,
        num_accepted_tokens=4,
        accepted_per_position=[2, 2],
        proposed_per_position=[2, 2, 2],
    )
    b = GenerationResult("b", [1], num_steps=2)
    tau, verify_rate, survival = summarize([a, b])
    assert tau == (4 + 2) / 2  # a per-pass mean over all 6 rounds would say (4 + 6) / 6
    assert verify_rate == (4 + 6) / (6 + 6)  # committed / verified, over every pass
    assert survival == [1.0, 1.0, 0.0]


def test_eval_cli_writes_reports(tmp_path, monkeypatch):
    target_dir = tiny_hf_target_dir(tmp_path / "target")
    target = load_target(str(target_dir))
    drafts = [
        save_draft(tiny_draft(target, algo, feature_layers=(0, 1, 2), block_size=4), tmp_path / algo)
        for algo in ("eagle3", "dspark")
    ]
    (tmp_path / "data" / "eval").mkdir(parents=True)
    (tmp_path / "data" / "eval" / "toy.jsonl").write_text(
        "\n".join(json.dumps({"turns": [q]}) for q in ["add 1 and 2", "say hi"]) + "\n"
    )
    monkeypatch.setenv("DEEPSPEC_DATASETS_DIR", str(tmp_path / "data"))
    code = main(
        [
            "eval",
            "--target",
            str(target_dir),
            "--draft",
            *map(str, drafts),
            "--datasets",
            "toy",
            "--num-prompts",
            "2",
            "--max-tokens",
            "8",
            "--num-speculative-tokens",
            "4",
        ]
    )
    assert code == 0
    for d in drafts:
        report = json.loads((d / "eval.json").read_text())
        assert [(r["dataset"], r["temperature"]) for r in report["results"]] == [("toy", 0.0), ("toy", 1.0)]
        greedy = report["results"][0]
        assert greedy["identical_to_target"] is True and greedy["num_steps"] >= greedy["num_drafted_steps"]
        if greedy["num_drafted_steps"]:  # τ over drafted rounds; none when the budget cut every round
            assert greedy["acceptance_length"] >= 1.0
        else:
            assert greedy["acceptance_length"] is None
        assert (d / "eval.md").is_file() and (d / "acceptance.png").stat().st_size > 1000


def test_eval_rejects_unknown_dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPSPEC_DATASETS_DIR", str(tmp_path))
    (tmp_path / "eval").mkdir()
    target_dir = tiny_hf_target_dir(tmp_path / "target")
    with pytest.raises(FileNotFoundError, match="eval dataset 'nope' not found"):
        main(
            [
                "eval",
                "--target",
                str(target_dir),
                "--draft",
                "prompt-lookup",
                "--datasets",
                "nope",
                "--out",
                str(tmp_path / "o"),
            ]
        )


def test_verify_tokens_per_step_prefers_the_engines_count():
    from types import SimpleNamespace

    from training.evaluate import verify_tokens_per_step

    tree = SimpleNamespace(num_steps=4, num_draft_tokens=40, num_verify_tokens=44)
    assert verify_tokens_per_step([tree]) == 11.0
    old = SimpleNamespace(num_steps=4, num_draft_tokens=12)  # an engine that keeps no verify count
    assert verify_tokens_per_step([old]) == 4.0


def test_draft_specs_carry_options_and_labels(tmp_path):
    from training.draft_specs import parse_draft_spec, tree_variants

    spec = parse_draft_spec("prompt-lookup:max_ngram=3,mode=fast,tree=true")
    assert spec.base == "prompt-lookup" and spec.options == {"max_ngram": 3, "mode": "fast", "tree": True}
    assert spec.label == 'prompt-lookup[max_ngram=3,mode="fast",tree=true]'
    assert parse_draft_spec(str(tmp_path)).label == tmp_path.name
    with pytest.raises(ValueError, match="not key=value"):
        parse_draft_spec("prompt-lookup:tree")
    (tmp_path / "config.json").write_text(json.dumps({"algo": "corpus-lookup"}))
    assert [v.options for v in tree_variants(str(tmp_path))] == [{"tree": False}, {"tree": True}]
    (tmp_path / "config.json").write_text(json.dumps({"algo": "medusa"}))
    assert tree_variants(str(tmp_path)) == []


def test_eval_reports_option_variants_side_by_side(tmp_path, monkeypatch, capsys):
    target_dir = tiny_hf_target_dir(tmp_path / "target")
    (tmp_path / "data" / "eval").mkdir(parents=True)
    (tmp_path / "data" / "eval" / "toy.jsonl").write_text(json.dumps({"turns": ["add 1 and 2 and 1 and 2"]}) + "\n")
    monkeypatch.setenv("DEEPSPEC_DATASETS_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    compare = tmp_path / "compare.md"
    code = main(
        [
            "eval",
            "--target",
            str(target_dir),
            "--draft",
            "prompt-lookup",
            "prompt-lookup:max_ngram=2",
            "--datasets",
            "toy",
            "--num-prompts",
            "1",
            "--max-tokens",
            "8",
            "--temperatures",
            "0",
            "--compare",
            str(compare),
        ]
    )
    assert code == 0
    assert "[eval] 3/3 " in capsys.readouterr().err  # one prompt, decoded target-only and by each of the two drafts
    rows = [line for line in compare.read_text().splitlines() if line.startswith("| prompt-lookup")]
    assert [r.split(" | ")[0] for r in rows] == ["| prompt-lookup", "| prompt-lookup[max_ngram=2]"]
    assert all(" | chain | toy | 0 | " in r for r in rows)
    report = json.loads((tmp_path / "runs" / "eval" / "prompt-lookup[max_ngram=2]" / "eval.json").read_text())
    (result,) = report["results"]
    assert report["options"] == {"max_ngram": 2} and result["tree"] is False
    assert result["verify_tokens_per_step"] >= 1.0
    assert main(["eval", "--target", str(target_dir), "--draft", "prompt-lookup:bogus=1", "--datasets", "toy"]) == 2
    assert "prompt-lookup:bogus=1" in capsys.readouterr().err


@pytest.mark.parametrize("verify_all", [False, True])
def test_eval_verify_all_turns_the_verify_budget_off(tmp_path, monkeypatch, verify_all):
    import deepspec.decoding.engine as engine_module

    built = []

    class Recording(engine_module.SpecEngine):
        def __init__(self, target, drafter, **kwargs):
            super().__init__(target, drafter, **kwargs)
            if drafter is not None:
                built.append(self.planner.step_time is not None)

    monkeypatch.setattr(engine_module, "SpecEngine", Recording)
    target_dir = tiny_hf_target_dir(tmp_path / "target")
    (tmp_path / "data" / "eval").mkdir(parents=True)
    (tmp_path / "data" / "eval" / "toy.jsonl").write_text(json.dumps({"turns": ["add 1 and 2 and 1 and 2"]}) + "\n")
    monkeypatch.setenv("DEEPSPEC_DATASETS_DIR", str(tmp_path / "data"))
    out = tmp_path / "report"
    code = main(
        [
            "eval",
            "--target",
            str(target_dir),
            "--draft",
            "prompt-lookup",
            "--datasets",
            "toy",
            "--num-prompts",
            "1",
            "--max-tokens",
            "8",
            "--temperatures",
            "0",
            "--out",
            str(out),
            *(["--verify-all"] if verify_all else []),
        ]
    )
    assert code == 0
    assert built == [not verify_all]
    assert json.loads((out / "eval.json").read_text())["settings"]["verify_budget"] is (not verify_all)


def test_a_prompt_file_is_an_eval_set_named_by_its_stem(tmp_path):
    """The synthetic held-out split is evaluated from its (gzip) file, and its results are called `prompts.heldout`,
    the name `--draft auto`'s ranking reads chat results under (deepspec.models.drafts.CHAT_SETS)."""
    import gzip

    from deepspec.models.drafts import CHAT_SETS
    from training.evaluate import eval_set_name, load_eval_prompts

    path = tmp_path / "prompts.heldout.jsonl.gz"
    path.write_bytes(gzip.compress(b"".join(json.dumps({"turns": [f"q{i}"]}).encode() + b"\n" for i in range(5))))
    assert load_eval_prompts(str(path), 3) == ["q0", "q1", "q2"]
    assert eval_set_name(str(path)) == "prompts.heldout" in CHAT_SETS
    assert eval_set_name("chat") == "chat" in CHAT_SETS

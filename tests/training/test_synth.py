"""synth: the user-turn filters, dedup, the held-out split (deterministic, and never trained on), resume, the CLI
end to end on a tiny target, and the native decoder answering exactly as the PyTorch engine does."""

from __future__ import annotations

import json
import random
import string

import pytest

from tests.training.helpers import tear_gzip
from training import heldout
from training.data import read_jsonl_lines
from training.synth_filters import Deduplicator, distinct_n, reject_reason, topic_of

SPECIALS = frozenset({1, 2})


def _reason(text, tokens=(5, 6, 7), finish="stop"):
    return reject_reason(text, list(tokens), finish, SPECIALS)


def test_filters_name_what_is_wrong():
    assert _reason("Can you write a Python function that reverses a list?") is None
    assert _reason("Can you write a Python function that reverses a list?", finish="length") == "unfinished"
    assert _reason("   \n ") == "empty"
    assert _reason("What is the capital of France?", tokens=(5, 1, 6)) == "template_leak"
    assert _reason("Tell me a joke <|im_start|>assistant") == "template_leak"
    assert _reason("Tell me a joke please.\nassistant\nSure") == "template_leak"
    assert _reason("Hi there") == "too_short"
    assert _reason("Please explain " + "why " * 700) == "too_long"
    assert _reason("请问你能帮我写一首关于春天的诗吗？谢谢你的帮助") == "not_english"
    assert _reason("Zxq vbn mkl poiu trewq") == "not_english"
    assert _reason("Is this 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 ### $$$ %%% ^^^ &&& ***") == "garbage"
    assert _reason("Can you " + "tell me more " * 10) == "repetitive"


def test_dedup_catches_exact_and_near_duplicates_only():
    dedup = Deduplicator(threshold=0.7)
    base = "Can you give me some tips on how to keep a sourdough starter alive while I travel for two weeks?"
    assert dedup.check_and_add(base) is None
    assert (
        dedup.check_and_add(
            "  can you GIVE me some tips on how to keep a sourdough starter alive while I travel for two weeks?"
        )
        == "exact_duplicate"
    )
    assert dedup.check_and_add(base.replace("two weeks", "three weeks")) == "near_duplicate"
    assert dedup.check_and_add("Write a haiku about the first snow falling on a quiet mountain village.") is None
    assert len(dedup) == 2


def test_topics_and_diversity():
    assert topic_of("Write a Python function to parse a date") == "coding"
    assert topic_of("Convert this list to JSON") == "json/data"
    assert topic_of("Calculate 12 * 7 for me") == "math"
    assert topic_of("Write a poem about autumn") == "writing"
    assert topic_of("Who was the first emperor of Rome?") == "question"
    assert distinct_n(["a b c", "a b c"]) == 0.5 and distinct_n(["a b", "c d"]) == 1.0


def test_heldout_split_is_deterministic_and_about_two_percent():
    rng = random.Random(0)
    texts = [" ".join("".join(rng.choices(string.ascii_lowercase, k=5)) for _ in range(6)) for _ in range(20000)]
    held = [t for t in texts if heldout.is_heldout(t)]
    assert 0.015 < len(held) / len(texts) < 0.025
    # keyed on the text itself: case and spacing do not move a prompt across the split; the key is fixed forever
    assert all(heldout.is_heldout("  " + t.upper() + "\n") for t in held[:50])
    assert heldout.text_key("Hello  World") == heldout.text_key("hello world") == "878633aa32a3b150"
    assert heldout.heldout_path(heldout.Path("d/p.jsonl")).name == "p.heldout.jsonl"
    assert heldout.heldout_path(heldout.Path("d/p.jsonl.gz")).name == "p.heldout.jsonl.gz"


def _heldout_text(synthetic=True):
    rng = random.Random(1)
    while True:
        text = "Question " + " ".join(rng.choices(["alpha", "beta", "gamma", "delta", "why", "how"], k=8))
        if heldout.is_heldout(text) == synthetic:
            return text


def test_training_loaders_drop_the_heldout_split(tmp_path):
    """A held-out synthetic prompt is not trained on in any file it travels in; a held-out file is refused."""
    from deepspec.models import load_target
    from tests.training.helpers import tiny_hf_target_dir
    from training.data import DataStats, load_sequences
    from training.prepare import PrepareStats, read_prompts

    target = load_target(str(tiny_hf_target_dir(tmp_path / "target")))
    held, kept = _heldout_text(True), _heldout_text(False)
    rows = [
        {
            "source": "synth/default",
            "conversations": [{"role": "user", "content": t}, {"role": "assistant", "content": "ok then"}],
        }
        for t in (held, kept)
    ]
    rows.append({"source": "gsm8k", "conversations": rows[0]["conversations"]})  # only synthetic rows are split
    data = tmp_path / "conv.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stats = DataStats()
    assert len(load_sequences([data], target, 256, stats)) == 2 and stats.num_heldout == 1

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"source": "synth/x", "turns": [t]}) + "\n" for t in (held, kept)))
    stats = PrepareStats()
    assert [r.turns[0] for r in read_prompts([prompts], None, 0, stats)] == [kept] and stats.num_heldout == 1

    copy = tmp_path / "p.heldout.jsonl"
    copy.write_text(prompts.read_text())
    with pytest.raises(ValueError, match="held-out"):
        load_sequences([copy], target, 256, text_rows=True)
    with pytest.raises(ValueError, match="held-out"):
        read_prompts([copy], None, 0, PrepareStats())


@pytest.fixture
def tiny_target(tmp_path, monkeypatch):
    """The tiny target writes random characters: every turn passes the filters here, so the mechanics show."""
    from deepspec.models import load_target
    from tests.training.helpers import tiny_hf_target_dir

    monkeypatch.setattr("training.synth.reject_reason", lambda *a, **k: None)
    # half the prompts held out, so a few rows show the split
    monkeypatch.setattr("training.synth.is_heldout", lambda text: heldout.is_heldout(text, per_10k=5000))
    return load_target(str(tiny_hf_target_dir(tmp_path / "target")))


def _texts(path):
    return [json.loads(line)["turns"][0] for line in path.read_text().splitlines()] if path.exists() else []


def _attempts(files):
    rows = [
        json.loads(line)
        for path in (files.prompts, files.heldout)
        if path.exists()
        for line in path.read_text().splitlines()
    ]
    return sorted((r["attempt"], r["turns"][0]) for r in rows)


@pytest.mark.parametrize("backend,batch", [("pytorch", 1), ("native", 4)])
def test_synthesize_splits_and_resumes_where_it_stopped(tmp_path, tiny_target, backend, batch):
    """A run killed mid-way (attempts finishing out of order) and resumed draws exactly the turns of one run straight
    through; held-out turns only ever land in the held-out file."""
    from training.synth import SynthFiles, SynthSettings, synthesize

    target = tiny_target
    if backend == "native":
        from deepspec.models.native import NativeUnavailable, native_target_from

        try:
            target = native_target_from(tiny_target, num_threads=1)
        except NativeUnavailable as exc:
            pytest.skip(f"no native decoder here: {exc}")

    def run(files, n, on_result=None):
        return synthesize(
            target, files, SynthSettings(num_prompts=n, batch_size=batch, max_tokens=6), on_result=on_result
        )

    straight = SynthFiles(tmp_path / "a" / "p.jsonl")
    run(straight, 10)
    resumed = SynthFiles(tmp_path / "b" / "p.jsonl")

    def killed_after_five(state, _tokens):
        if state.attempts == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(resumed, 10, killed_after_five)
    second = run(resumed, 10)
    assert second.accepted + second.heldout == 10
    for files in (straight, resumed):
        train, held = _texts(files.prompts), _texts(files.heldout)
        assert train and held and not set(train) & set(held)
        assert all(heldout.is_heldout(t, per_10k=5000) for t in held)
    assert [k for k, _ in _attempts(straight)] == list(range(10))
    assert _attempts(resumed) == _attempts(straight)

    # rows finish out of order: a killed run can hold attempts 0-2 and 4-6 but not 3; the resumed run fills the gap
    gappy = SynthFiles(tmp_path / "c" / "p.jsonl")
    gappy.prompts.parent.mkdir()
    for src, dst in ((straight.prompts, gappy.prompts), (straight.heldout, gappy.heldout)):
        rows = [line for line in src.read_text().splitlines() if json.loads(line)["attempt"] in (0, 1, 2, 4, 5, 6)]
        dst.write_text("".join(line + "\n" for line in rows))
    run(gappy, 10)
    assert _attempts(gappy) == _attempts(straight)


def test_cli_synthesizes_answers_and_writes_a_card(tmp_path, tiny_target, capsys):
    from training.__main__ import main

    target_dir = tmp_path / "target"
    mix = tmp_path / "mix.jsonl"
    mix.write_text("".join(json.dumps({"turns": [f"q{i}"]}) + "\n" for i in range(3)))
    out, answers = tmp_path / "s" / "prompts.jsonl", tmp_path / "s" / "conv.jsonl"
    args = [
        "synth",
        "--out",
        str(out),
        "--num-prompts",
        "6",
        "--answers",
        str(answers),
        "--mix",
        str(mix),
        "--chunk",
        "3",
        "--target",
        str(target_dir),
        "--backend",
        "pytorch",
        "--max-user-tokens",
        "6",
        "--max-tokens",
        "4",
        "--max-seq-len",
        "64",
    ]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["kept"] == 6 and summary["answer_tokens_per_second"] > 0
    rows = [json.loads(line) for line in answers.read_text().splitlines()]
    held = set(_texts(out.with_name("prompts.heldout.jsonl")))
    assert held and not held & {r["conversations"][0]["content"] for r in rows}  # never answered for training
    assert len(rows) == 6 - len(held) + 3 and all(r["answer_tokens"] >= 1 for r in rows)

    with pytest.raises(SystemExit):  # existing files are only extended on purpose
        main(args)
    capsys.readouterr()
    # compressed outputs (the tracked data is): a run killed mid-member is mended by the next, which goes on
    packed = tmp_path / "packed" / "p.jsonl.gz"
    packed_answers = packed.with_name("c.jsonl.gz")
    packed_args = [*args[:2], str(packed), args[3], "2", args[5], str(packed_answers), *args[7:]]
    assert main(packed_args) == 0
    answered = read_jsonl_lines(packed_answers)
    for path in (packed, packed_answers):
        tear_gzip(path, '{"id": "cut mid-li')
    assert main([*packed_args[:4], "4", *packed_args[5:], "--resume"]) == 0
    assert len(read_jsonl_lines(packed)) + len(read_jsonl_lines(packed.with_name("p.heldout.jsonl.gz"))) == 4
    mended = read_jsonl_lines(packed_answers)
    assert mended[: len(answered)] == answered and all(json.loads(line)["id"] for line in mended)
    assert main([*args[:4], "8", *args[5:], "--resume"]) == 0
    assert len(_texts(out)) + len(_texts(out.with_name("prompts.heldout.jsonl"))) == 8

    card = tmp_path / "card"
    assert main(["card", "--prompts", str(out), "--answers", str(answers), "--card-dir", str(card)]) == 0
    assert {"CARD.md", "lengths.png", "topics.png", "sample.jsonl"} <= {p.name for p in card.iterdir()}
    assert "synthetic prompts kept: 8" in (card / "CARD.md").read_text()


def test_stream_regenerate_resumes_after_a_kill(tmp_path):
    """Rows are written as they finish: a run stopped mid-way keeps them, and the next one does only the rest."""
    from deepspec.decoding.params import SamplingParams
    from deepspec.models import load_target
    from tests.training.helpers import tiny_hf_target_dir
    from training.prepare import PrepareStats, read_prompts, stream_regenerate

    target = load_target(str(tiny_hf_target_dir(tmp_path / "target")))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [f"q{i}", f"and {i}?"]}) + "\n" for i in range(6)))
    rows = read_prompts([prompts], None, 0, PrepareStats())
    out, params = tmp_path / "out.jsonl", SamplingParams(max_tokens=4)

    seen = []

    def killed_after_two(_tokens):
        seen.append(1)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stream_regenerate(rows, target, params, out, PrepareStats(), batch_size=3, on_row=killed_after_two)
    assert len(out.read_text().splitlines()) == 2
    stats = stream_regenerate(rows, target, params, out, PrepareStats(), batch_size=3)
    assert stats.num_skipped == 2 and stats.num_done == 4
    convs = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(c["id"] for c in convs) == [f"p:{i}" for i in range(1, 7)]
    assert all([m["role"] for m in c["conversations"]] == ["user", "assistant"] * 2 for c in convs)


def test_native_backend_answers_as_the_pytorch_engine_does(tmp_path):
    """The fast path changes the speed, not the data: greedy answers on the native decoder equal the PyTorch
    engine's on the same weights."""
    from deepspec.decoding.params import SamplingParams
    from deepspec.models import load_target
    from deepspec.models.native import NativeUnavailable, native_target_from
    from tests.training.helpers import tiny_hf_target_dir
    from training.prepare import PrepareStats, read_prompts, stream_regenerate

    reference = load_target(str(tiny_hf_target_dir(tmp_path / "target")))
    try:
        native = native_target_from(reference, num_threads=1)
    except NativeUnavailable as exc:
        pytest.skip(f"no native decoder here: {exc}")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [t]}) + "\n" for t in ("hello there", "2+2=?", "def f(x):")))
    rows = read_prompts([prompts], None, 0, PrepareStats())
    answers = {}
    for name, target in (("pytorch", reference), ("native", native)):
        out = tmp_path / f"{name}.jsonl"
        stream_regenerate(rows, target, SamplingParams(max_tokens=12), out, PrepareStats(), batch_size=3)
        answers[name] = [json.loads(line)["conversations"][1]["content"] for line in out.read_text().splitlines()]
    assert answers["native"] == answers["pytorch"] and all(answers["native"])

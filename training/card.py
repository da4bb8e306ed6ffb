"""`python -m training card`: the data card of a synthesized data set, rebuilt from its files by one command.

Reads the files `synth` writes (prompts, held-out prompts, rejected turns, answered conversations) and writes into
`--card-dir`: CARD.md (how the data was made, counts, rejection reasons, topics, the seeding comparison, length
percentiles), lengths.png and topics.png (histograms), and sample.jsonl (a few conversations of the training split,
small enough to track in git while the data itself stays out of it).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from training.heldout import HELDOUT_PER_10K, SYNTH_SOURCE_PREFIX, is_heldout_row

#: conversations copied into sample.jsonl
SAMPLE_ROWS = 40


def add_card_parser(sub) -> None:
    p = sub.add_parser(
        "card",
        help="data card (CARD.md + histograms + a small sample) of a synthesized data set",
        description="Counts, rejection reasons, topics, the seeding comparison and length "
        "histograms of `synth`'s files, written as CARD.md, lengths.png, topics.png and sample.jsonl.",
    )
    p.add_argument("--prompts", required=True, type=Path, help="synth --out (its .heldout/.rejected files beside)")
    p.add_argument("--answers", type=Path, default=None, help="synth --answers conversations")
    p.add_argument("--card-dir", required=True, type=Path, help="directory to write CARD.md and the plots into")
    p.add_argument("--built-with", default=None, help="the command that built the data, quoted in the card")


def _conversations(path: Path | None) -> list[dict]:
    from training.synth import read_rows

    return read_rows(path) if path is not None else []


def answer_stats(conversations: list[dict]) -> dict:
    """Per source group (synthetic, and each --mix file): conversations and answer tokens."""
    groups: dict[str, list[int]] = {}
    for row in conversations:
        source = str(row.get("source", "?"))
        group = SYNTH_SOURCE_PREFIX if source.startswith(SYNTH_SOURCE_PREFIX) else source
        groups.setdefault(group, []).append(int(row.get("answer_tokens", 0)))
    return {
        g: {
            "conversations": len(v),
            "answer_tokens": sum(v),
            "median_answer_tokens": sorted(v)[len(v) // 2] if v else 0,
        }
        for g, v in sorted(groups.items())
    }


def plot_card(prompts: list[dict], conversations: list[dict], card_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].hist([int(r.get("tokens", 0)) for r in prompts], bins=40, color="tab:blue")
    axes[0].set(title="synthesized user turns", xlabel="tokens", ylabel="prompts")
    by_group: dict[str, list[int]] = {}
    for row in conversations:
        source = str(row.get("source", "?"))
        by_group.setdefault("synthetic" if source.startswith(SYNTH_SOURCE_PREFIX) else source, []).append(
            int(row.get("answer_tokens", 0))
        )
    if by_group:
        axes[1].hist(list(by_group.values()), bins=40, stacked=True, label=list(by_group))
        axes[1].legend()
    axes[1].set(title="target answers", xlabel="tokens", ylabel="conversations")
    fig.tight_layout()
    fig.savefig(card_dir / "lengths.png", dpi=90)
    plt.close(fig)

    topics = Counter(r.get("topic", "?") for r in prompts).most_common()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.barh([t for t, _ in topics][::-1], [c for _, c in topics][::-1], color="tab:green")
    ax.set(title="topics of the synthesized user turns (keyword buckets)", xlabel="prompts")
    fig.tight_layout()
    fig.savefig(card_dir / "topics.png", dpi=90)
    plt.close(fig)
    return ["lengths.png", "topics.png"]


def write_card(prompts_path: Path, answers_path: Path | None, card_dir: Path, command: str | None = None) -> dict:
    from training.synth import SynthFiles, read_rows, synth_report

    card_dir.mkdir(parents=True, exist_ok=True)
    files = SynthFiles(prompts_path)
    report = synth_report(files)
    prompts = read_rows(files.prompts) + read_rows(files.heldout)
    conversations = [r for r in _conversations(answers_path) if not is_heldout_row(r)]
    answers = answer_stats(conversations)
    plot_card(prompts, conversations, card_dir)
    sample = [r for r in conversations if str(r.get("source", "")).startswith(SYNTH_SOURCE_PREFIX)][:SAMPLE_ROWS]
    with (card_dir / "sample.jsonl").open("w", encoding="utf-8") as f:
        for row in sample:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    (card_dir / "CARD.md").write_text(_markdown(report, answers, command), encoding="utf-8")
    return {"report": report, "answers": answers}


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _markdown(report: dict, answers: dict, command: str | None) -> str:
    total_answers = sum(g["answer_tokens"] for g in answers.values())
    seeding = [
        [
            mode,
            s["attempts"],
            s["kept_rate"],
            s["duplicate_rate"],
            s["dirty_rate"],
            s["distinct_2"],
            s["topic_entropy_bits"],
        ]
        for mode, s in report["seeding"].items()
    ]
    parts = [
        "# Synthetic chat data: data card",
        "",
        "Generated by `python -m training card`; do not edit by hand. User turns written by the target itself "
        "(Magpie-style: the target continues its own chat template's user prefix, sampled at temperature 1, top-p "
        "0.95, with the template's own system prompt or 'You are a helpful assistant for <topic>.'), filtered "
        "(cut-off turns, template-token leaks, length, non-English, garbage, loops) and deduplicated (exact, and "
        "MinHash near duplicates), then answered by the same target (greedy) on the native decoder, with the "
        "shipped train prompts (datasets/train) mixed in. No eval set is used.",
        "",
        f"Held out: {HELDOUT_PER_10K / 100:g}% of the synthetic prompts by a hash of their text "
        "(training/heldout.py), in the `.heldout.jsonl` file beside the prompts; never answered for training, "
        "and dropped by every training loader.",
        "",
    ]
    if command:
        parts += ["Built with:", "", "```", command, "```", ""]
    parts += [
        "## Counts",
        "",
        f"- synthetic prompts kept: {report['kept']} ({report['heldout']} held out), rejected: {report['rejected']}",
        f"- conversations: {sum(g['conversations'] for g in answers.values())}, answer tokens: {total_answers:,}",
        "",
        _table(
            ["source", "conversations", "answer tokens", "median answer tokens"],
            [[g, s["conversations"], f"{s['answer_tokens']:,}", s["median_answer_tokens"]] for g, s in answers.items()],
        ),
        "",
        "Rejected turns by reason:",
        "",
        _table(["reason", "turns"], [[r, c] for r, c in report["rejected_by_reason"].items()]),
        "",
        "## Seeding: the template's own system prompt vs topic system prompts",
        "",
        "kept = passed the filters and dedup; dirty = failed a filter; distinct-2 on an equal number of each "
        "mode's first kept turns.",
        "",
        _table(["seeding", "attempts", "kept", "duplicates", "dirty", "distinct-2", "topic entropy (bits)"], seeding),
        "",
        "## Topics and lengths",
        "",
        _table(["topic", "prompts"], [[t, c] for t, c in report["topics"].items()]),
        "",
        "User-turn tokens, percentiles: " + ", ".join(f"p{q} {v}" for q, v in report["user_turn_tokens"].items()),
        "",
        "![lengths](lengths.png)",
        "",
        "![topics](topics.png)",
        "",
        f"`sample.jsonl`: the first {SAMPLE_ROWS} synthetic conversations of the training split.",
        "",
    ]
    return "\n".join(parts)


def run_card_cli(args) -> int:
    try:
        for path in (args.prompts, args.answers):
            if path is not None and not path.is_file():
                raise FileNotFoundError(f"not found: {path}")
        summary = write_card(args.prompts, args.answers, args.card_dir, args.built_with)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        json.dumps(
            {
                "card": str(args.card_dir / "CARD.md"),
                "kept": summary["report"]["kept"],
                "conversations": sum(g["conversations"] for g in summary["answers"].values()),
                "answer_tokens": sum(g["answer_tokens"] for g in summary["answers"].values()),
            }
        )
    )
    return 0

"""training/draft_table.py: the drafts' tables are rendered from their eval.json, and a stale one fails."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from training.draft_table import BEGIN, END, main

REPO_DRAFTS = Path(__file__).resolve().parents[2] / "drafts"


def test_the_committed_draft_tables_agree_with_the_eval_files():
    assert main(["--drafts", str(REPO_DRAFTS), "--check"]) == 0


def _drafts(tmp_path: Path) -> Path:
    drafts = tmp_path / "drafts"
    (drafts / "d1").mkdir(parents=True)
    shutil.copy(REPO_DRAFTS / "smollm2-135m-corpus" / "eval.json", drafts / "d1" / "eval.json")
    (drafts / "README.md").write_text(f"# drafts\n\n{BEGIN}\n{END}\n\nprose\n")
    return drafts


def test_a_changed_eval_makes_the_table_stale_until_it_is_rendered_again(tmp_path, capsys):
    drafts = _drafts(tmp_path)
    assert main(["--drafts", str(drafts), "--check"]) == 1  # never rendered
    assert main(["--drafts", str(drafts)]) == 0 and main(["--drafts", str(drafts), "--check"]) == 0
    report = json.loads((drafts / "d1" / "eval.json").read_text())
    report["results"][0]["acceptance_length"] = 9.87
    (drafts / "d1" / "eval.json").write_text(json.dumps(report))
    assert main(["--drafts", str(drafts), "--check"]) == 1
    assert "stale" in capsys.readouterr().err
    main(["--drafts", str(drafts)])
    assert "9.87" in (drafts / "README.md").read_text() and "prose" in (drafts / "README.md").read_text()
    assert "9.87" in (drafts / "reports" / "d1" / "eval.md").read_text()


def test_a_readme_without_the_markers_is_refused(tmp_path, capsys):
    drafts = _drafts(tmp_path)
    (drafts / "README.md").write_text("# drafts\n")
    assert main(["--drafts", str(drafts), "--check"]) == 2
    assert "generated block" in capsys.readouterr().err

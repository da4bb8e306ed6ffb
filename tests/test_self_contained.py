"""The repository stands alone: nothing tracked reads or cites a folder beside the checkout (the parent's `shared`), and
every design document the code cites is in `docs/`. A clone of this repository alone must pass `make test`."""

import re
import subprocess
from pathlib import Path

from deepspec.paths import repo_root

#: a path outside the checkout: the parent's `shared`, `shared/datasets`, or one built as `... / "shared" / ...`
OUTSIDE = re.compile(r"\.\./shared\b|\bshared/datasets\b|[\"']shared[\"']\s*/")
#: a design document cited by name; outside docs/ it must be cited as docs/<NAME>.md
DESIGN_DOC = re.compile(r"(?<![\w/])(docs/)?(ALGORITHMS|ARCHITECTURE|EXPORT|STYLE)\.md")
#: shipped data, not text anyone writes citations in
SKIPPED_SUFFIXES = (".jsonl", ".safetensors", ".png", ".gguf", ".pt")


def tracked_text_files() -> list[Path]:
    root = repo_root()
    names = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    files = [root / n for n in names.decode().split("\0") if n and not n.endswith(SKIPPED_SUFFIXES)]
    assert len(files) > 100, "git ls-files found almost nothing: is this a checkout?"
    return [f for f in files if f.is_file() and f != Path(__file__).resolve()]


def lines_of(path: Path):
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # a binary file: no citations in it
        return
    yield from enumerate(text.splitlines(), 1)


def test_nothing_reads_or_cites_a_folder_beside_the_checkout():
    found = [
        f"{f.relative_to(repo_root())}:{n}: {line.strip()}"
        for f in tracked_text_files()
        for n, line in lines_of(f)
        if OUTSIDE.search(line)
    ]
    assert not found, "paths outside the repository (ship the data in datasets/, the design in docs/):\n" + "\n".join(
        found
    )


def test_design_documents_are_cited_where_they_are():
    docs = repo_root() / "docs"
    wrong = []
    for f in tracked_text_files():
        in_docs = f.parent == docs
        for n, line in lines_of(f):
            for m in DESIGN_DOC.finditer(line):
                exists = (docs / f"{m.group(2)}.md").is_file()
                if not exists or not (m.group(1) or in_docs):
                    wrong.append(f"{f.relative_to(repo_root())}:{n}: {m.group(0)}")
    assert not wrong, "cite design documents as docs/<NAME>.md, and only ones that exist:\n" + "\n".join(wrong)


def test_the_patterns_catch_what_they_guard_against():
    """The two tests above pass on a clean tree; this shows they would fail on the lines that broke clones."""
    assert OUTSIDE.search('return repo_root().parent / "shared" / "datasets"')
    parent = ".."  # spelled apart so this file does not itself hold the path it guards against
    assert OUTSIDE.search(f"python -m training prepare --inputs {parent}/shared/datasets/train/gsm8k_train.jsonl.gz")
    assert not OUTSIDE.search("one KV cache shared by every sequence; datasets/eval")
    assert [m.group(1) for m in DESIGN_DOC.finditer("the losses of ALGORITHMS.md; see docs/ALGORITHMS.md")] == [
        None,
        "docs/",
    ]

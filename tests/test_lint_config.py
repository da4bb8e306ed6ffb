"""`make lint` is part of `make test` (issue 43 item 7): ruff and pyright at the versions the lint extra pins, and
the pre-commit hooks at those same versions, so a commit hook never passes what `make test` then refuses."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def lint_pins() -> dict[str, str]:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["lint"]
    pins = {}
    for requirement in extra:
        match = re.fullmatch(r"([a-z-]+)(?:\[[a-z]+\])?==([\d.]+)", requirement)
        if match:
            pins[match.group(1)] = match.group(2)
    return pins


def test_ruff_and_pyright_are_pinned():
    assert set(lint_pins()) == {"ruff", "pyright"}


def test_the_pre_commit_hooks_run_the_pinned_ruff_and_the_projects_pyright():
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    repos = {repo["repo"]: repo for repo in config["repos"]}
    ruff = repos["https://github.com/astral-sh/ruff-pre-commit"]
    assert ruff["rev"] == "v" + lint_pins()["ruff"]
    assert {hook["id"] for hook in ruff["hooks"]} == {"ruff-check", "ruff-format"}
    [pyright] = repos["local"]["hooks"]
    # --project: a pyrightconfig.json in a folder above the checkout must not replace pyproject.toml's settings
    assert pyright["entry"] == ".venv/bin/pyright --project pyproject.toml" and pyright["pass_filenames"] is False


def test_make_test_runs_make_lint_and_lint_runs_both_tools():
    makefile = (ROOT / "Makefile").read_text()
    test_rule = re.search(r"^test:(.*)$", makefile, re.M)
    assert test_rule and "lint" in test_rule.group(1).split()
    lint_recipe = re.search(r"^lint:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert lint_recipe
    recipe = lint_recipe.group(1)
    assert (
        "ruff check ." in recipe and "ruff format --check ." in recipe and "pyright --project pyproject.toml" in recipe
    )
    extras = re.search(r"^EXTRAS \?= (.*)$", makefile, re.M)
    assert extras and "lint" in extras.group(1).split(",")


def test_pyright_checks_every_python_folder_of_the_tree():
    pyright = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pyright"]
    assert pyright["typeCheckingMode"] == "basic"
    folders = {
        d.name
        for d in ROOT.iterdir()
        if d.is_dir() and not d.name.startswith(".") and d.name not in ("build", "dist") and any(d.rglob("*.py"))
    }
    assert folders <= set(pyright["include"]), sorted(folders - set(pyright["include"]))

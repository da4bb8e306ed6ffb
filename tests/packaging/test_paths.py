"""Shipped data is found through deepspec.paths whatever runs it (checkout or installed wheel), a drafts location can
be given with DEEPSPEC_DRAFTS_DIR, and an empty one says so loudly: `--draft auto` would silently serve no draft."""

from __future__ import annotations

import logging

import pytest

from deepspec import cli, paths


@pytest.fixture(autouse=True)
def fresh_warnings():
    paths._warn_if_no_drafts.cache_clear()
    yield
    paths._warn_if_no_drafts.cache_clear()


def test_the_shipped_drafts_and_datasets_are_the_packages(monkeypatch):
    monkeypatch.delenv("DEEPSPEC_DRAFTS_DIR", raising=False)
    monkeypatch.delenv("DEEPSPEC_DATASETS_DIR", raising=False)
    assert paths.drafts_dir() == (paths.SHIPPED / "drafts").resolve()
    assert (paths.drafts_dir() / "smollm2-135m-corpus" / "config.json").is_file()
    assert (paths.datasets_dir() / "train" / "codealpaca.jsonl.gz").is_file()
    # in a checkout the package's folders are the checkout's own (links), so nothing is kept twice
    assert paths.drafts_dir() == paths.repo_root() / "drafts"


def test_a_drafts_location_from_the_environment_is_used_and_an_empty_one_is_loud(tmp_path, monkeypatch, caplog):
    from deepspec.models.drafts import shipped_drafts_dir

    monkeypatch.setenv("DEEPSPEC_DRAFTS_DIR", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="deepspec.paths"):
        assert shipped_drafts_dir() == tmp_path
    assert "no drafts in" in caplog.text and "DEEPSPEC_DRAFTS_DIR" in caplog.text
    caplog.clear()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text("{}")
    paths._warn_if_no_drafts.cache_clear()
    with caplog.at_level(logging.WARNING, logger="deepspec.paths"):
        paths.drafts_dir()
    assert "no drafts" not in caplog.text


def test_the_console_script_names_every_stage_and_refuses_an_unknown_one(capsys):
    assert cli.main([]) == 2 and "commands:" in capsys.readouterr().out
    assert cli.main(["serving"]) == 2 and "unknown command 'serving'" in capsys.readouterr().err
    assert set(cli.COMMANDS) == {"serve", "worker", "gateway", "train", "export", "loadtest", "plugins"}
    with pytest.raises(SystemExit) as exit_:
        cli.main(["gateway", "--help"])
    assert exit_.value.code == 0 and "--http-port" in capsys.readouterr().out

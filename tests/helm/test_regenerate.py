"""helm/tools/regenerate.py: the generators' shared write-or-check command line."""

from __future__ import annotations

from tests.docker import load_script
from tests.helm.conftest import REPO


def _regenerate():
    return load_script("regenerate", REPO / "helm" / "tools" / "regenerate.py").regenerate


def test_writes_then_checks_and_names_the_stale_files(tmp_path, capsys):
    regenerate = _regenerate()
    current, missing = tmp_path / "a.json", tmp_path / "b.json"
    files = {current: "{}\n", missing: "[]\n"}
    assert regenerate(lambda: files, ["--check"], "gen", "tool.py") == 1  # nothing written yet
    assert not current.exists() and not missing.exists()
    assert "run python tool.py" in capsys.readouterr().err
    assert regenerate(lambda: files, [], "gen", "tool.py") == 0
    assert current.read_text() == "{}\n" and missing.read_text() == "[]\n"
    assert regenerate(lambda: files, ["--check"], "gen", "tool.py") == 0
    current.write_text("{ }\n")  # a hand edit
    assert regenerate(lambda: files, ["--check"], "gen", "tool.py") == 1
    assert str(current) in capsys.readouterr().err and current.read_text() == "{ }\n"

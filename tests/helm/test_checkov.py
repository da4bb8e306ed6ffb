"""checkov (Bridgecrew's Kubernetes policy checks) on the rendered chart: the default values, the two production
profiles and each engine runtime's profile (vllm, sglang, trtllm-serve). A check may fail only when the chart
README's "Checkov findings left open" table gives the reason.

checkov lives in its own virtual environment (`make system-deps` puts it under .venv/tools/checkov): it pins
networkx, packaging and python-dateutil to old releases that would downgrade what torch and the rest of the project
run on, so it cannot join a pyproject extra. One run covers all three profiles (its start-up dominates).
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import yaml

from tests.helm.conftest import CHART_DIR, PROFILES, REPO, RUNTIME_PROFILES, VALUE_SETS, manifests, render
from tests.tools import require_tool

CHECKED = PROFILES + RUNTIME_PROFILES

CHECKOV_VENV = REPO / ".venv" / "tools" / "checkov" / "bin" / "checkov"
BEGIN, END = "<!-- checkov-reasons:begin -->", "<!-- checkov-reasons:end -->"
CHECK_ID = re.compile(r"\bCKV2?_K8S_\d+\b")


def _checkov() -> str:
    return require_tool("checkov", CHECKOV_VENV, how="`make system-deps` installs it under .venv/tools/checkov")


def documented_reasons() -> dict[str, str]:
    """Check id -> the README row that explains why it may fail."""
    text = (CHART_DIR / "README.md").read_text()
    table = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    reasons = {}
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) == 3 and CHECK_ID.search(cells[0]):
            assert len(cells[2]) > 20, f"no real reason given: {row}"
            for check in CHECK_ID.findall(cells[0]):
                reasons[check] = cells[2]
    return reasons


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    binary = _checkov()
    out = tmp_path_factory.mktemp("checkov")
    for name in CHECKED:
        (out / f"{name}.yaml").write_text(yaml.safe_dump_all(manifests(render(VALUE_SETS[name])), sort_keys=False))
    result = subprocess.run(
        [
            binary,
            "--directory",
            str(out),
            "--framework",
            "kubernetes",
            "--output",
            "json",
            "--quiet",
            "--compact",
            "--skip-download",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "LOG_LEVEL": "ERROR"},
    )
    assert result.returncode in (0, 1), result.stderr[-2000:]  # 1 = some check failed
    [body] = [
        r
        for r in (lambda d: d if isinstance(d, list) else [d])(json.loads(result.stdout))
        if r["check_type"] == "kubernetes"
    ]
    return body


def test_every_profile_is_checked(report):
    summary = report["summary"]
    assert summary["parsing_errors"] == 0
    assert summary["resource_count"] >= 60 and summary["passed"] >= 700, summary  # all three profiles were read
    # --quiet reports failures only; the image-digest finding (see the README) shows each file was read.
    files = {c["file_path"].lstrip("/") for c in report["results"]["failed_checks"]}
    assert files == {f"{name}.yaml" for name in CHECKED}


def test_no_checkov_failure_without_a_written_reason(report):
    reasons = documented_reasons()
    unexplained = sorted(
        {
            f"{c['check_id']} {c['check_name']} ({c['resource']} in {c['file_path']})"
            for c in report["results"]["failed_checks"]
            if c["check_id"] not in reasons
        }
    )
    assert not unexplained, "checkov failures with no reason in helm/deepspec/README.md:\n" + "\n".join(unexplained)


def test_the_reasons_table_has_no_stale_rows(report):
    """A row whose check no longer fails is removed, so the table stays a list of open findings."""
    failing = {c["check_id"] for c in report["results"]["failed_checks"]}
    assert set(documented_reasons()) <= failing

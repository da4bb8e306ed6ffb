"""`--format vllm`: the draft in the layout vLLM loads, with its launch command.

EAGLE-3 goes out in the `speculators` layout (`layers.0.*`, `Eagle3Speculator`, the target named as verifier), so
`vllm serve DIR/draft` alone serves target + draft; the `--speculative-config` form works too. DFlash and DSpark
go out as `DFlashDraftModel` / `Qwen3DSparkModel` (export/drafts/block.py) behind `--speculative-config`.
"""

from __future__ import annotations

import json
from pathlib import Path

from export import snippets
from export.drafts.writers import check_draft, draft_writer, exported_draft, write_draft_dir
from export.job import ExportFormat, ExportJob

ENGINE = "vllm"


def check(job: ExportJob) -> None:
    check_draft(ENGINE, job)


def write(job: ExportJob, out: Path, progress) -> dict:
    draft = exported_draft(job)
    fields = write_draft_dir(ENGINE, job, out, progress)
    spec = snippets.vllm_speculative_config(job, "draft")
    (out / "launch").mkdir()
    (out / "launch" / "vllm-speculative-config.json").write_text(json.dumps(spec, indent=2) + "\n")
    command = snippets.vllm_command(job, "draft")
    snippets.write_script(out / "launch" / "vllm.sh", command)
    launch = {"vllm": command}
    sections = {"Serve with vLLM": f"```sh\n{command}\n```"}
    if draft_writer(ENGINE, draft).names_its_target:
        launch["vllm_speculators"] = "vllm serve draft"
        sections["Serve with vLLM"] += (
            "\n\nThe draft is in the `speculators` format, which names its target "
            "(`speculators_config.verifier`), so this works as well:\n\n"
            "```sh\nvllm serve draft\n```"
        )
    sections["Captured layers"] = (
        f"`eagle_aux_hidden_state_layer_ids` / `target_layer_ids` in `draft/config.json`: "
        f"{fields['engine_layer_ids'][ENGINE]} (vLLM's own numbering)."
    )
    snippets.write_readme(
        out,
        f"{draft.algo} draft for vLLM",
        f"Target `{job.target.spec}`, draft `{draft.path.name}`, weights in {job.dtype}.",
        sections,
    )
    return {"draft": "draft", "launch": launch, "engine_layer_ids": fields["engine_layer_ids"]}


FORMAT = ExportFormat(
    name="vllm",
    runtime="vLLM (vllm serve; EAGLE-3 in the speculators format, DFlash, DSpark)",
    write=write,
    check=check,
)

"""`--format sglang`: the draft in the layout SGLang loads, with its launch flags.

EAGLE-3 goes out as `LlamaForCausalLMEagle3` with `midlayer.*` keys: SGLang's loader silently drops keys it does
not know (`layers.0.*`, q/k-norm, biases), so anything it would drop is refused up front (export/drafts/eagle3.py)
and tests replay its key filter on the output. DFlash/DSpark go out in the layout of export/drafts/block.py.
"""

from __future__ import annotations

from pathlib import Path

from export import snippets
from export.drafts.writers import check_draft, exported_draft, write_draft_dir
from export.job import ExportFormat, ExportJob

ENGINE = "sglang"


def check(job: ExportJob) -> None:
    check_draft(ENGINE, job)


def write(job: ExportJob, out: Path, progress) -> dict:
    draft = exported_draft(job)
    fields = write_draft_dir(ENGINE, job, out, progress)
    command = snippets.sglang_command(job, "draft")
    snippets.write_script(out / "launch" / "sglang.sh", command)
    snippets.write_readme(
        out,
        f"{draft.algo} draft for SGLang",
        f"Target `{job.target.spec}`, draft `{draft.path.name}`, weights in {job.dtype}.",
        {
            "Serve with SGLang": f"```sh\n{command}\n```",
            "Captured layers": f"{fields['engine_layer_ids'][ENGINE]} in SGLang's numbering (`draft/config.json`).",
        },
    )
    return {"draft": "draft", "launch": {"sglang": command}, "engine_layer_ids": fields["engine_layer_ids"]}


FORMAT = ExportFormat(
    name="sglang", runtime="SGLang (--speculative-algorithm EAGLE3 | DFLASH | DSPARK)", write=write, check=check
)

"""Generate helm/deepspec/values.schema.json and the chart README's values table from values.yaml.

    python helm/tools/values_docs.py            # rewrite both
    python helm/tools/values_docs.py --check    # exit 1 when either is stale (tests run this)

values.yaml is the single source: each key's `# --` comment becomes its description, its default value gives its
type, and `# @schema <key>: <yaml>` lines add or override JSON-schema keywords (`enum`, `type`, `items`,
`additionalProperties`, `minimum`...). Rules the hints don't have to repeat:
- objects reject unknown keys, except empty `{}` defaults and keys hinted `additionalProperties: true`
  (free-form maps such as nodeSelector, annotations, resources);
- integers are >= 0, and keys ending in `Port` lie in 1..65535;
- a list's item type comes from its first default item; empty lists need an `items` hint.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling module, whether run or loaded by path
from regenerate import regenerate

CHART = Path(__file__).resolve().parents[1] / "deepspec"
BEGIN, END = "<!-- values-table:begin -->", "<!-- values-table:end -->"
JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_.\-]*):(?:\s|$)")


def parse_comments(text: str, values: dict) -> dict[str, dict]:
    """Dotted key path -> {"description": str, "hints": dict} from the comments above each mapping key."""
    found: dict[str, dict] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing mapping keys
    description: list[str] = []
    hints: dict = {}
    in_description = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            description, in_description = [stripped[4:].strip()], True
            continue
        if stripped.startswith("# @schema"):
            hints.update(yaml.safe_load(stripped[len("# @schema") :].strip()))
            continue
        if stripped.startswith("#"):
            if in_description:
                description.append(stripped[1:].strip())
            continue
        match = KEY_LINE.match(line)
        if not stripped or not match:
            # A blank line, a list item or a continuation: what was collected belongs to no key.
            if stripped:
                description, hints, in_description = [], {}, False
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = [key for _, key in stack] + [match["key"]]
        free_form = any(
            found.get(".".join(path[:i]), {}).get("hints", {}).get("additionalProperties") for i in range(1, len(path))
        )
        # Keys inside lists and inside free-form maps are examples of a default, not values of their own.
        if _lookup(values, path[:-1], dict) is not None and not free_form:
            found[".".join(path)] = {"description": " ".join(description).strip(), "hints": hints}
        stack.append((indent, match["key"]))
        description, hints, in_description = [], {}, False
    return found


def _lookup(values: Any, path: list[str], kind: type) -> Any:
    node = values
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node if isinstance(node, kind) else None


def schema_for(value: Any, path: list[str], comments: dict[str, dict]) -> dict:
    entry = comments.get(".".join(path), {"description": "", "hints": {}})
    hints = dict(entry["hints"])
    schema: dict[str, Any] = {}
    if entry["description"]:
        schema["description"] = entry["description"]
    if isinstance(value, bool):
        schema["type"] = "boolean"
    elif isinstance(value, int):
        schema["type"] = "integer"
        schema.update({"minimum": 1, "maximum": 65535} if path[-1].endswith("Port") else {"minimum": 0})
    elif isinstance(value, float):
        schema["type"] = "number"
    elif isinstance(value, str):
        schema["type"] = "string"
    elif isinstance(value, list):
        schema["type"] = "array"
        if value:
            first = value[0]
            schema["items"] = {"type": "object"} if isinstance(first, dict) else schema_for(first, path + ["[]"], {})
    elif isinstance(value, dict):
        schema["type"] = "object"
        if value and not hints.get("additionalProperties"):
            schema["properties"] = {k: schema_for(v, path + [k], comments) for k, v in value.items()}
            schema["additionalProperties"] = False
    if "type" in hints:  # a hinted type replaces the inferred one with its bounds
        schema.pop("minimum", None)
        schema.pop("maximum", None)
    schema.update(hints)
    return schema


def build_schema(values_text: str) -> dict:
    values = yaml.safe_load(values_text)
    comments = parse_comments(values_text, values)
    schema = schema_for(values, [], comments)
    schema.pop("description", None)
    return {"$schema": "http://json-schema.org/draft-07/schema#", "title": "Values of the deepspec chart", **schema}


def values_table(values_text: str) -> str:
    """Markdown table of every leaf value (objects with properties are expanded)."""
    values = yaml.safe_load(values_text)
    comments = parse_comments(values_text, values)
    rows = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for path, entry in comments.items():
        value = _lookup(values, path.split("."), object)
        if isinstance(value, dict) and value and not entry["hints"].get("additionalProperties"):
            continue  # expanded into its own keys
        kind = entry["hints"].get("type") or JSON_TYPES[type(value)]
        if isinstance(kind, list):
            kind = " or ".join(kind)
        default = json.dumps(value)
        if len(default) > 60:
            default = default[:57] + "..."
        description = entry["description"].replace("|", "\\|")
        if "enum" in entry["hints"]:
            description += " One of: " + ", ".join(f"`{v}`" if v else '`""`' for v in entry["hints"]["enum"]) + "."
        rows.append(f"| `{path}` | {kind} | `{default.replace('|', chr(92) + '|')}` | {description} |")
    return "\n".join(rows)


def render() -> dict[Path, str]:
    """Path -> generated text of values.schema.json and README.md."""
    values_text = (CHART / "values.yaml").read_text()
    readme = (CHART / "README.md").read_text()
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return {
        CHART / "values.schema.json": json.dumps(build_schema(values_text), indent=2) + "\n",
        CHART / "README.md": f"{head}{BEGIN}\n{values_table(values_text)}\n{END}{tail}",
    }


def main(argv: list[str] | None = None) -> int:
    return regenerate(render, argv, (__doc__ or "").partition("\n")[0], "helm/tools/values_docs.py")


if __name__ == "__main__":
    raise SystemExit(main())

"""Structured outputs at the gateway: the request fields that ask for one, resolved to the one `Constraint` a worker
compiles (deepspec_protocol/worker.py), and that constraint in the fields an OpenAI-HTTP upstream reads.

Three spellings, one meaning, at most one per request (two constraints are a 400: vLLM would merge them):

- OpenAI's `response_format`: `{"type": "json_object"}`, or `{"type": "json_schema", "json_schema": {"name", "schema",
  "strict", "description"}}` (OpenAI's shape: `name` required, at most 64 of `[a-zA-Z0-9_-]`; `schema` required
  here, since a schema-less json_schema would constrain nothing); `{"type": "text"}` is no constraint.
- vLLM's `structured_outputs` (vllm/sampling_params.py StructuredOutputsParams): exactly one of `json` (a schema, as
  an object or its JSON text), `regex`, `choice` (a list of strings), `grammar` (EBNF, xgrammar's dialect),
  `json_object: true`. Its tuning options (whitespace, additional properties, structural tags) are not implemented
  and, like any unknown field, refused by name.
- vLLM's older top-level `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`.

The schema is enforced whatever `strict` says (as vLLM does); whether a spec compiles is the engine's to say: the
worker answers 400 with the code `structured_output_invalid`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from deepspec_protocol.worker import Constraint
from service.gateway.validation import STRICT, Text

#: OpenAI's rule for a response format's name
SchemaName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
#: a regex or grammar: the engine compiles it
Spec = Annotated[Text, Field(min_length=1)]
#: the strings a choice constraint allows
Choices = Annotated[list[Annotated[Text, Field(min_length=1)]], Field(min_length=1)]
#: a JSON schema, as an object or as its JSON text (vLLM takes both)
Schema = dict[str, Any] | Spec

#: the name a json_schema constraint goes upstream under: OpenAI's shape needs one, no engine reads it
_UPSTREAM_SCHEMA_NAME = "response"


class JsonSchemaFormat(BaseModel):
    model_config = STRICT
    name: SchemaName
    description: Text | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format: text (no constraint), json_object, or json_schema with its schema."""

    model_config = STRICT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _check_schema(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with type json_schema, and only then")
        return self

    def constraint(self) -> Constraint | None:
        if self.type == "json_object":
            return Constraint("json_object")
        if self.type == "json_schema":
            assert self.json_schema is not None  # _check_schema: present exactly with this type
            return Constraint("json_schema", json.dumps(self.json_schema.schema_))
        return None


class StructuredOutputs(BaseModel):
    """vLLM's structured_outputs: exactly one constraint."""

    model_config = STRICT
    json_: Schema | None = Field(default=None, alias="json")
    regex: Spec | None = None
    choice: Choices | None = None
    grammar: Spec | None = None
    json_object: bool | None = None

    @model_validator(mode="after")
    def _check_one(self):
        kinds = [kind for kind, value in self._constraints() if value is not None]
        if len(kinds) != 1:
            raise ValueError(
                f"set exactly one of json, regex, choice, grammar or json_object: true (got "
                f"{', '.join(kinds) or 'none'})"
            )
        return self

    def _constraints(self) -> list[tuple[str, Constraint | None]]:
        return [
            ("json", None if self.json_ is None else _schema(self.json_)),
            ("regex", None if self.regex is None else Constraint("regex", self.regex)),
            ("choice", None if self.choice is None else _choice(self.choice)),
            ("grammar", None if self.grammar is None else Constraint("grammar", self.grammar)),
            ("json_object", Constraint("json_object") if self.json_object else None),
        ]

    def constraint(self) -> Constraint:
        return next(c for _, c in self._constraints() if c is not None)


def _schema(schema: dict | str) -> Constraint:
    return Constraint("json_schema", schema if isinstance(schema, str) else json.dumps(schema))


def _choice(options: list[str]) -> Constraint:
    return Constraint("choice", json.dumps(options, ensure_ascii=False))


class StructuredOutputFields(BaseModel):
    """The request fields that constrain the output (chat and completions alike)."""

    model_config = STRICT
    response_format: ResponseFormat | None = None
    #: vLLM's extension
    structured_outputs: StructuredOutputs | None = None
    #: vLLM's older extensions, one constraint each
    guided_json: Schema | None = None
    guided_regex: Spec | None = None
    guided_choice: Choices | None = None
    guided_grammar: Spec | None = None

    @model_validator(mode="after")
    def _check_one_constraint(self):
        fields = [name for name, constraint in self._constraints() if constraint is not None]
        if len(fields) > 1:
            raise ValueError(
                f"send one output constraint, got {' and '.join(fields)} (response_format, "
                "structured_outputs and each guided_* field set one)"
            )
        return self

    def _constraints(self) -> list[tuple[str, Constraint | None]]:
        return [
            ("response_format", self.response_format and self.response_format.constraint()),
            ("structured_outputs", self.structured_outputs and self.structured_outputs.constraint()),
            ("guided_json", None if self.guided_json is None else _schema(self.guided_json)),
            ("guided_regex", None if self.guided_regex is None else Constraint("regex", self.guided_regex)),
            ("guided_choice", None if self.guided_choice is None else _choice(self.guided_choice)),
            ("guided_grammar", None if self.guided_grammar is None else Constraint("grammar", self.guided_grammar)),
        ]

    @property
    def constraint(self) -> Constraint | None:
        """The request's one constraint; None = free text."""
        return next((c for _, c in self._constraints() if c is not None), None)


def structured_outputs_field(constraint: Constraint) -> dict:
    """`constraint` as vLLM's `structured_outputs` object (what the gRPC API validates and a vLLM upstream reads);
    ValueError for a choice spec that is not a JSON list."""
    if constraint.kind == "json_object":
        return {"json_object": True}
    if constraint.kind == "choice":
        try:
            return {"choice": json.loads(constraint.spec)}
        except json.JSONDecodeError as e:
            raise ValueError(f"a choice constraint's spec is a JSON list of strings: {e}") from None
    key = {"json_schema": "json", "regex": "regex", "grammar": "grammar"}.get(constraint.kind)
    if key is None:
        raise ValueError(
            f"structured output kind must be one of json_object, json_schema, regex, grammar, choice, "
            f"got {constraint.kind!r}"
        )
    return {key: constraint.spec}


def response_format_field(constraint: Constraint) -> dict | None:
    """`constraint` as OpenAI's `response_format`, which vLLM, SGLang and trtllm-serve all read; None for the kinds
    it cannot spell (regex, grammar, choice). ValueError for a json_schema spec that is not JSON."""
    if constraint.kind == "json_object":
        return {"type": "json_object"}
    if constraint.kind != "json_schema":
        return None
    try:
        schema = json.loads(constraint.spec)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid json_schema constraint: the schema is not JSON: {e}") from None
    return {"type": "json_schema", "json_schema": {"name": _UPSTREAM_SCHEMA_NAME, "schema": schema, "strict": True}}

"""The gateway's JSON codec answers as the standard library does, orjson's edges included."""

from __future__ import annotations

import json
import math

import pytest

from service.gateway.json_codec import dumps, loads

#: texts orjson refuses and `json` reads: each must still parse, to what `json` makes of it
ONLY_JSON_READS = [b'{"logprob": -Infinity}', b"[NaN]", b'["\\ud800"]']


@pytest.mark.parametrize("text", ONLY_JSON_READS)
def test_loads_reads_what_json_reads(text):
    expected, parsed = json.loads(text), loads(text)
    assert repr(parsed) == repr(expected)  # repr: NaN != NaN


def test_loads_refuses_what_json_refuses_with_its_error():
    with pytest.raises(json.JSONDecodeError):
        loads(b'{"model": ')


@pytest.mark.parametrize(
    "value",
    [
        {"id": "cmpl-1", "choices": [{"index": 0, "text": 'héllo \u2028 "q"', "logprobs": None}], "created": 1},
        {"top_logprobs": [{"a": -0.5, "b": -9999.0}], "text_offset": [0, 3], "ok": True},
        [],
        {},
        "",
        0,
    ],
)
def test_dumps_writes_the_bytes_json_writes(value):
    assert dumps(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def test_dumps_writes_what_orjson_cannot_through_json():
    """Integers past 64 bits and non-str keys, which orjson refuses by default."""
    value = {"big": 2**70, 1: "one"}
    assert dumps(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def test_dumps_writes_nan_and_infinities_as_null():
    assert json.loads(dumps({"logprob": -math.inf, "x": math.nan})) == {"logprob": None, "x": None}

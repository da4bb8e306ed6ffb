"""JSON on the gateway's hot paths (response bodies, SSE events, upstream requests and answers): orjson, with the
standard library's answer wherever the two would differ.

orjson encodes and parses several times faster than `json`, a cost the gateway pays on every request and every
streamed chunk. They part at the edges: orjson refuses what `json` reads or writes (NaN and Infinity in a text,
lone surrogates, integers past 64 bits to write), so each function here falls back to `json` for whatever orjson
refuses, and the errors stay `json`'s. Two differences remain: a NaN or infinite float is written as null, where
`json` would write `NaN` (not JSON) or refuse it (the gateway floors its logprobs before they get here,
logprobs.py); and an integer past 64 bits is read as a float, which no upstream answer holds (counts, indices,
texts and logprobs).
"""

from __future__ import annotations

import json

import orjson


def loads(data: bytes | str):
    """`json.loads(data)`, by orjson where it can."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def dumps(value) -> bytes:
    """`json.dumps(value, ensure_ascii=False, separators=(",", ":"))` as UTF-8 (NaN and infinities as null)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:
        pass
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()

"""An OpenAI upstream that answers canned bytes: /health, /v1/models and /v1/completions (whole, or streamed as 16
one-token events, the usage and `[DONE]`), whatever the request asked. It costs next to nothing, so a gateway in
front of it spends only its own work (bench/gateway_instructions.py).

    python -m bench.canned_upstream --port 9000
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import cast

MODEL = "stub"
NUM_TOKENS = 16
#: seconds a whole completion takes to answer (--delay-ms), as a model would
DELAY_S = 0.0


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _completion(choices: list[dict], usage: dict | None = None) -> dict:
    body = {"id": "cmpl-canned", "object": "text_completion", "created": 0, "model": MODEL, "choices": choices}
    return body if usage is None else {**body, "usage": usage}


USAGE = {"prompt_tokens": 5, "completion_tokens": NUM_TOKENS, "total_tokens": 5 + NUM_TOKENS}
MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 2048}]}).encode()
WHOLE = json.dumps(
    _completion([{"index": 0, "text": "a" * NUM_TOKENS, "logprobs": None, "finish_reason": "length"}], USAGE)
).encode()
_TOKEN = _event(_completion([{"index": 0, "text": "a", "logprobs": None, "finish_reason": None}]))
_LAST = _event(_completion([{"index": 0, "text": "a", "logprobs": None, "finish_reason": "length"}]))
EVENTS = [_TOKEN] * (NUM_TOKENS - 1) + [_LAST, _event(_completion([], USAGE)), b"data: [DONE]\n\n"]


def _answer(body: bytes, content_type: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (content_type, len(body), body)


class _Connection(asyncio.Protocol):
    """HTTP/1.1 with keep-alive, as far as a gateway's requests need: a head, a content-length body."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a server hands its protocol a stream Transport (asyncio's or uvloop's)
        self.transport, self.buffer = cast(asyncio.Transport, transport), b""

    def data_received(self, data):
        self.buffer += data
        while (head_end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:head_end].decode("latin-1").split("\r\n")
            fields = dict(line.lower().split(":", 1) for line in head[1:] if ":" in line)
            end = head_end + 4 + int(fields.get("content-length", "0"))
            if len(self.buffer) < end:
                return
            body, self.buffer = self.buffer[head_end + 4 : end], self.buffer[end:]
            path = head[0].split(" ")[1]
            if path == "/health":
                self.transport.write(_answer(b"{}"))
            elif path == "/v1/models":
                self.transport.write(_answer(MODELS))
            elif json.loads(body or b"{}").get("stream"):
                asyncio.ensure_future(self._stream())
            elif DELAY_S:
                asyncio.get_running_loop().call_later(DELAY_S, self.transport.write, _answer(WHOLE))
            else:
                self.transport.write(_answer(WHOLE))

    async def _stream(self):
        """One event per write and a turn of the loop between them, as an engine sends tokens."""
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for event in EVENTS:
            self.transport.write(b"%x\r\n%s\r\n" % (len(event), event))
            await asyncio.sleep(0)
        self.transport.write(b"0\r\n\r\n")


async def serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_Connection, "127.0.0.1", port)
    await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="port to listen on (127.0.0.1)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="answer whole completions after this long")
    args = parser.parse_args(argv)
    global DELAY_S
    DELAY_S = args.delay_ms / 1000
    asyncio.run(serve(args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`AsyncResource`: the start/aclose life of the load tester's clients and of its fake server, and `async with`.

Their sockets and connection pools must be opened inside the running event loop, so none of them opens anything in
`__init__`: `start()` opens, `aclose()` closes, and `async with` does both around a block. One definition of that
pairing, so every client and server enters and exits the same way.
"""

from __future__ import annotations

from typing import Self


class AsyncResource:
    async def start(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

"""A TCP forwarder: `python -m claimwarden_lab.forward HOST PORT TARGET_PORT` (TARGET on 127.0.0.1).

The real node's pods reach the apiserver at the `kubernetes` Service address (10.0.0.1:443, in the
lab's serving certificate) although it listens on 127.0.0.1 and no kube-proxy runs (realnode.py).
"""

from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def _serve(host: str, port: int, target: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer), return_exceptions=True)

    server = await asyncio.start_server(handle, host, port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))

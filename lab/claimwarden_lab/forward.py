"""A TCP forwarder (TARGET on 127.0.0.1):
`python -m claimwarden_lab.forward HOST PORT TARGET_PORT [--delay-file FILE] [--partition-file FILE]`.

The real node's pods reach the apiserver at the `kubernetes` Service address (10.0.0.1:443, in the
lab's serving certificate) although it listens on 127.0.0.1 and no kube-proxy runs (realnode.py).

Tests put it between one claimwarden replica and the apiserver to make that replica's link slow.
With ``--delay-file``, every byte from the client is delivered to the target that many seconds
(a float in the file; no file, or an empty one, means none) after the forwarder received it, read
when it arrives, so a test changes the delay by rewriting the file. It models latency on the wire,
not a proxy that could take a request back:

- bytes keep their order (a chunk received after a smaller delay waits for the ones before it);
- a client that closes its connection (or resets it, or exits) does not recall what it sent: the
  bytes already received are still delivered at their time, and the close reaches the target after
  them, delayed like data (TCP delivers a FIN after the data sent before it);
- answers (target to client) are not delayed.

With ``--partition-file``, the link is cut while that file exists, and heals when it is removed. A cut
link is a blackhole, not a refusal: connections are still accepted, and nothing passes either way; what
either side sends meanwhile is dropped, never delivered later. A connection that lost bytes so is reset
(both sides) when the link heals, as TCP gives a connection up whose retransmissions were all lost; a
connection that sent nothing during the cut goes on. It models a partition longer than what TCP's
retransmissions bridge; a shorter one, whose bytes arrive after it, is a delay (above).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

Delay = Callable[[], float]
Flag = Callable[[], bool]
HEAL_POLL_SECONDS = 0.1


class Cut:
    """One connection's view of the partition: whether to drop what passes now, and whether it lost bytes."""

    def __init__(self, partitioned: Flag) -> None:
        self.partitioned = partitioned
        self.broken = False

    def drops(self) -> bool:
        if self.partitioned():
            self.broken = True
            return True
        return False


def flag_from(path: Path | None) -> Flag:
    """True while the file at ``path`` exists."""
    return lambda: path is not None and path.exists()


def delay_from(path: Path | None) -> Delay:
    """The added delay in seconds, as the file at ``path`` says now (0 without a file or a number)."""
    def read() -> float:
        if path is None:
            return 0.0
        try:
            return max(0.0, float(path.read_text().strip() or 0))
        except (OSError, ValueError):
            return 0.0
    return read


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cut: Cut | None = None) -> None:
    try:
        while data := await reader.read(65536):
            if cut is not None and cut.drops():
                continue
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def _delayed_pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: Delay,
                        cut: Cut | None = None) -> None:
    """Like `_pipe`, with each chunk (and the end of the stream) delivered `delay()` seconds after it came."""
    loop = asyncio.get_running_loop()
    held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def receive() -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if cut is None or not cut.drops():
                    held.put_nowait((loop.time() + delay(), data))
        held.put_nowait((loop.time() + delay(), b""))  # the close, or a reset: after everything before it

    receiving = asyncio.create_task(receive())
    try:
        while True:
            due, data = await held.get()
            await asyncio.sleep(max(0.0, due - loop.time()))
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # a half-close, as the client's FIN: the target may still answer
    finally:
        receiving.cancel()


async def _serve(host: str, port: int, target: int, delay: Delay | None = None,
                 partitioned: Flag | None = None) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            writer.close()
            return
        cut = Cut(partitioned) if partitioned is not None else None
        reset = asyncio.create_task(_reset_when_healed(cut, writer, upstream_writer)) if cut else None
        try:
            if delay is None:
                await asyncio.gather(_pipe(reader, upstream_writer, cut), _pipe(upstream_reader, writer, cut),
                                     return_exceptions=True)
                return
            # The answers go on to the client while it is there, and are read to the end after it left, so the
            # target sees a peer that receives them, as it would from a closed client's kernel.
            answers = asyncio.create_task(_drain_into(upstream_reader, writer, cut))
            await asyncio.gather(_delayed_pipe(reader, upstream_writer, delay, cut), return_exceptions=True)
            await asyncio.gather(answers, return_exceptions=True)
            upstream_writer.close()
        finally:
            if reset is not None:
                reset.cancel()

    server = await asyncio.start_server(handle, host, port)
    async with server:
        await server.serve_forever()


async def _reset_when_healed(cut: Cut, *writers: asyncio.StreamWriter) -> None:
    """Once the link heals, reset a connection that lost bytes to the partition (both of its sides)."""
    while not cut.broken or cut.partitioned():
        await asyncio.sleep(HEAL_POLL_SECONDS)
    for writer in writers:
        writer.transport.abort()


async def _drain_into(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cut: Cut | None = None) -> None:
    """Copy ``reader`` to ``writer`` until the end; once ``writer`` fails, keep reading and drop the bytes."""
    alive = True
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            if not alive or (cut is not None and cut.drops()):
                continue
            try:
                writer.write(data)
                await writer.drain()
            except (OSError, RuntimeError):
                alive = False
    writer.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m claimwarden_lab.forward")
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("target_port", type=int)
    parser.add_argument("--delay-file", type=Path, default=None,
                        help="a file holding the seconds by which to delay what clients send (rewritten at will)")
    parser.add_argument("--partition-file", type=Path, default=None,
                        help="while this file exists, nothing passes either way (what is sent is dropped)")
    args = parser.parse_args(argv)
    delay = delay_from(args.delay_file) if args.delay_file else None
    partitioned = flag_from(args.partition_file) if args.partition_file else None
    asyncio.run(_serve(args.host, args.port, args.target_port, delay, partitioned))


if __name__ == "__main__":
    main()

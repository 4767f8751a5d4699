"""The lab's forwarder as a slow link: what a client sends arrives later, in order, even after the client left."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from claimwarden_lab.forward import _serve, delay_from, flag_from
from claimwarden_lab.processes import free_port


class Target:
    """A server that records when each byte and the end of each stream arrived, and answers "ok"."""

    def __init__(self) -> None:
        self.arrived: list[tuple[float, bytes]] = []
        self.ended: list[float] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while data := await reader.read(65536):
            self.arrived.append((loop.time(), data))
            writer.write(b"ok")
        self.ended.append(loop.time())
        writer.close()


class Link:
    """A `Target` behind the forwarder, whose delay is the file `delay_file` (and which is cut while
    `partition_file`, when given, exists)."""

    def __init__(self, delay_file: Path | None, partition_file: Path | None = None) -> None:
        self.delay_file = delay_file
        self.partition_file = partition_file
        self.target = Target()

    async def __aenter__(self) -> Link:
        self.server = await asyncio.start_server(self.target.handle, "127.0.0.1", 0)
        self.port = free_port()
        self.forwarder = asyncio.create_task(_serve(
            "127.0.0.1", self.port, self.server.sockets[0].getsockname()[1],
            delay_from(self.delay_file) if self.delay_file else None,
            flag_from(self.partition_file) if self.partition_file else None))
        for _ in range(100):
            with contextlib.suppress(OSError):
                _, probe = await asyncio.open_connection("127.0.0.1", self.port)
                probe.close()
                break
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *_: object) -> None:
        self.forwarder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.forwarder
        self.server.close()

    async def send(self, data: bytes, delay: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, float]:
        """With the delay set to `delay`, connect and send `data`; also return when it was sent."""
        if self.delay_file is not None:
            self.delay_file.write_text(f"{delay:g}")
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(data)
        return reader, writer, asyncio.get_running_loop().time()


def test_bytes_arrive_the_delay_later_in_order_and_answers_are_not_delayed(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[float], list[bytes], float]:
        async with Link(tmp_path / "delay") as link:
            reader, writer, sent = await link.send(b"first", 0.4)
            await asyncio.sleep(0.05)
            link.delay_file.write_text("0")  # the second chunk may not overtake the first
            writer.write(b"second")
            assert await reader.read(2) == b"ok"
            answered = asyncio.get_running_loop().time() - sent
            writer.close()
            await asyncio.sleep(0.1)
        arrived = link.target.arrived
        return [at - sent for at, _ in arrived], [data for _, data in arrived], answered

    times, data, answered = asyncio.run(scenario())
    assert b"".join(data) == b"firstsecond"
    assert times[0] == pytest.approx(0.4, abs=0.1) and times[-1] >= times[0]
    assert answered == pytest.approx(0.4, abs=0.1)


def test_what_a_client_sent_before_it_closed_still_arrives_and_the_close_after_it(tmp_path: Path) -> None:
    async def scenario() -> tuple[float, bytes, float]:
        async with Link(tmp_path / "delay") as link:
            _, writer, sent = await link.send(b"POST /late", 0.5)
            await asyncio.sleep(0.2)
            closed = asyncio.get_running_loop().time()
            writer.close()  # the client gave up (a timeout) long before its request arrived
            await asyncio.sleep(1.0)
        target = link.target
        assert target.arrived and target.ended
        return target.arrived[-1][0] - sent, target.arrived[-1][1], target.ended[-1] - closed

    arrived, data, ended = asyncio.run(scenario())
    assert data == b"POST /late" and arrived == pytest.approx(0.5, abs=0.1)
    assert ended == pytest.approx(0.5, abs=0.1)


def test_no_delay_file_means_no_delay(tmp_path: Path) -> None:
    assert delay_from(tmp_path / "missing")() == 0.0
    (tmp_path / "empty").write_text("")
    assert delay_from(tmp_path / "empty")() == 0.0


async def _answer(reader: asyncio.StreamReader, within: float) -> bytes | None:
    """What the client reads within `within` seconds: the bytes, b"" at the end of the stream, None if nothing."""
    try:
        return await asyncio.wait_for(reader.read(2), within)
    except TimeoutError:
        return None
    except ConnectionResetError:
        return b""


@pytest.mark.parametrize("delayed", [False, True], ids=["plain", "with a delay file"])
def test_a_partition_drops_what_is_sent_and_resets_what_lost_bytes_when_it_heals(tmp_path: Path,
                                                                                delayed: bool) -> None:
    cut = tmp_path / "partitioned"

    async def scenario() -> None:
        async with Link(tmp_path / "delay" if delayed else None, cut) as link:
            reader, writer, _ = await link.send(b"before", 0)
            assert await _answer(reader, 1) == b"ok"
            idle_reader, idle_writer, _ = await link.send(b"idle", 0)
            assert await _answer(idle_reader, 1) == b"ok"
            cut.touch()
            writer.write(b"during")
            assert await _answer(reader, 0.5) is None, "nothing comes back through a cut link"
            late_reader, late_writer, _ = await link.send(b"new", 0)  # accepted, then a blackhole
            assert await _answer(late_reader, 0.5) is None
            cut.unlink()  # healed: what lost bytes is reset, the idle connection goes on
            assert await _answer(reader, 2) == b""
            assert await _answer(late_reader, 2) == b""
            idle_writer.write(b"after")
            assert await _answer(idle_reader, 1) == b"ok"
            for each in (writer, idle_writer, late_writer):
                each.close()
            await asyncio.sleep(0.1)
        received = b"".join(data for _, data in link.target.arrived)
        assert b"during" not in received and b"new" not in received, "dropped, never delivered later"
        assert b"before" in received and b"after" in received

    asyncio.run(scenario())


def test_no_partition_file_means_no_partition(tmp_path: Path) -> None:
    assert not flag_from(tmp_path / "missing")()
    assert not flag_from(None)()

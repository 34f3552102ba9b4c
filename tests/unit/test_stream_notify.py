"""The notifier's bookkeeping when streams come and go while its (un)subscribe commands
are on their way: what Redis ends up subscribed to is what the hub watches. A stand-in
connection holds each command until the test lets it go."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import hiredis
from redis._parsers.hiredis import NOT_ENOUGH_DATA

from tokenq.api.stream_notify import StreamNotifier, _parsed_replies
from tokenq.api.streams import announced_entries


class HeldConnection:
    """Records each command; a send waits for `release`. Reads wait forever (no replies
    needed here)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, ...]] = []
        self.release = asyncio.Event()
        self.release.set()

    async def send_command(self, *args: str, check_health: bool = True) -> None:
        assert not check_health  # a health PING would read a pub/sub message as its reply
        await self.release.wait()
        self.sent.append(args)

    async def read_response(self, **_: Any) -> Any:
        await asyncio.Event().wait()

    async def disconnect(self) -> None:
        pass


class Pool:
    def __init__(self, conn: HeldConnection) -> None:
        self.conn = conn

    async def get_connection(self) -> HeldConnection:
        return self.conn

    async def release(self, conn: HeldConnection) -> None:
        pass


class Client:
    def __init__(self, conn: HeldConnection) -> None:
        self.connection_pool = Pool(conn)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def subscribed(sent: list[tuple[str, ...]]) -> set[str]:
    """What Redis would be subscribed to after these commands, in order."""
    now: set[str] = set()
    for command, *channels in sent:
        if command == "SUBSCRIBE":
            now |= set(channels)
        elif command == "UNSUBSCRIBE":
            now -= set(channels)
    return now


async def started() -> tuple[HeldConnection, StreamNotifier]:
    conn = HeldConnection()
    n = StreamNotifier(Client(conn), lambda *_: None)  # type: ignore[arg-type]
    await n.start()
    return conn, n


def test_a_stream_left_while_its_subscribe_is_in_flight_is_unsubscribed() -> None:
    async def main() -> None:
        conn, n = await started()
        await settle()
        conn.release.clear()
        n.want("a")
        n.want("b")
        await settle()  # the writer took {a, b} and waits on the connection
        n.unwant("a")  # left before Redis even heard of it
        conn.release.set()
        await settle()
        assert conn.sent[0] == ("SUBSCRIBE", "a", "b")
        assert subscribed(conn.sent) == {"b"}
        await n.stop()

    asyncio.run(main())


def test_a_stream_watched_again_while_its_unsubscribe_is_in_flight_stays() -> None:
    async def main() -> None:
        conn, n = await started()
        n.want("a")
        await settle()
        assert subscribed(conn.sent) == {"a"}
        conn.release.clear()
        n.unwant("a")
        await settle()  # UNSUBSCRIBE a on its way
        n.want("a")  # a new client for the same stream
        conn.release.set()
        await settle()
        assert subscribed(conn.sent) == {"a"}
        await n.stop()

    asyncio.run(main())


def test_many_streams_go_in_chunks_and_a_reconnect_subscribes_all_again() -> None:
    async def main() -> None:
        conn, n = await started()
        for i in range(1200):
            n.want(f"s{i}")
        await settle()
        assert [len(c) - 1 for c in conn.sent] == [512, 512, 176]
        conn.sent.clear()
        await n._drop()  # what the reader does on any error
        await n._connect()
        await settle()
        assert subscribed(conn.sent) == {f"s{i}" for i in range(1200)}
        await n.stop()

    asyncio.run(main())


def test_an_announcement_is_delivered_only_from_the_hubs_cursor() -> None:
    """A token write's announcement (shared/lua/append.lua) becomes entries only when it
    starts at the cursor and is well formed; anything else is a hint (an empty list), so a
    malformed or out-of-turn message can cost a read but never a gap or a wrong entry."""
    good = json.dumps(["1-0", "1-1", ["e", "token", "d", "x"], "2-0", ["e", "token"]])
    assert announced_entries(good, "1-0") == [("1-1", {"e": "token", "d": "x"}),
                                              ("2-0", {"e": "token"})]
    for message in ("", "{", "[]", '"1-0"', '{"a": 1}', json.dumps(["1-0"]),
                    json.dumps(["1-0", "1-1"]),                       # no fields
                    json.dumps(["1-0", "1-1", ["e"]]),                # odd fields
                    json.dumps(["1-0", 5, ["e", "token"]]),           # id not a string
                    json.dumps(["1-0", "1-1", ["e", 1]]),             # value not a string
                    json.dumps(["1-0", "1-1", {"e": "token"}])):      # fields not a list
        assert announced_entries(message, "1-0") == [], message
    assert announced_entries(good, "0-9") == []  # the hub is elsewhere: it reads instead


def test_replies_already_buffered_are_taken_without_a_read() -> None:
    """Several messages in one socket read are handed out at once; a reply cut in half is
    left for the next (timed) read."""
    class Parser:
        def __init__(self) -> None:
            self._reader = hiredis.Reader(encoding="utf-8", notEnoughData=NOT_ENOUGH_DATA)

    class Conn:
        _parser = Parser()

    def message(channel: str, data: str) -> bytes:
        parts = ["message", channel, data]
        return ("*3\r\n" + "".join(f"${len(p)}\r\n{p}\r\n" for p in parts)).encode()

    conn = Conn()
    conn._parser._reader.feed(message("a", "1") + message("b", "2") + message("c", "3")[:9])
    assert list(_parsed_replies(conn)) == [["message", "a", "1"], ["message", "b", "2"]]
    conn._parser._reader.feed(message("c", "3")[9:])
    assert list(_parsed_replies(conn)) == [["message", "c", "3"]]
    assert list(_parsed_replies(object())) == []  # not hiredis: nothing taken

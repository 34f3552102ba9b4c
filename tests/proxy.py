"""A small TCP proxy for tests: forwards to a target and can cut its connections, at once
or when the server's bytes reach a marker (e.g. after the Nth `event: token` line)."""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field


@dataclass
class Proxy:
    target: tuple[str, int]
    # Cut a connection (both sides) right after the server sent its `cut_after`-th
    # occurrence of `marker`; counts per connection; only the first `cut_times`
    # connections that reach it are cut.
    marker: bytes = b"event: token"
    cut_after: int = 0
    cut_times: int = 1
    connections: int = 0
    cuts: int = 0
    _srv: socket.socket = field(init=False)
    _socks: list[socket.socket] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Proxy:
        self._srv = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._srv.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._srv.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self.connections += 1
                self._socks += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, False),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True),
                             daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        seen = 0
        try:
            while data := src.recv(65536):
                if from_server and self.cut_after and self.cuts < self.cut_times:
                    at = self._find_cut(data, seen)
                    seen += data.count(self.marker)
                    if at is not None:
                        dst.sendall(data[:at])
                        with self._lock:
                            self.cuts += 1
                        self._close(src, dst)
                        return
                dst.sendall(data)
        except OSError:
            pass
        self._close(src, dst)

    def _find_cut(self, data: bytes, seen: int) -> int | None:
        """Offset just after the marker that makes `cut_after` (mid-message: the event's
        `data:` line has not been sent)."""
        pos = 0
        while (i := data.find(self.marker, pos)) >= 0:
            seen += 1
            pos = i + len(self.marker)
            if seen == self.cut_after:
                return pos
        return None

    @staticmethod
    def _close(*socks: socket.socket) -> None:
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def cut_all(self) -> None:
        with self._lock:
            socks, self._socks = self._socks, []
        self._close(*socks)

    def stop(self) -> None:
        self._srv.close()
        self.cut_all()

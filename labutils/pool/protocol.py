"""The rank pool's wire: control channel, messages and output framing (no torch; unit-tested alone).

Control channel
    The notebook listens on ``127.0.0.1`` with a port the OS picks (never a fixed port, never all
    interfaces) only while the ranks start; each rank connects once and the listener is closed.
    A peer must pass ``multiprocessing.connection``'s HMAC challenge with the pool's random
    32-byte token (both directions, as ``Listener(authkey=...)`` does) or it is dropped. The token
    reaches a rank through its stdin pipe: never on a command line (``ps`` shows those to every
    user) and never in the environment (inherited by whatever the rank starts).

Messages
    ``pack``/``unpack``: a pickled tuple ``(kind, task_id, body)``; ``body`` is bytes made by
    cloudpickle (functions defined in a notebook cell travel by value), so a body that cannot be
    unpickled on the other side becomes an error of that task instead of a broken channel.
    Notebook -> rank: ``call`` (``fn, args, kwargs``), ``exec`` (``code, filename, push, fetch``),
    ``stop``. Rank -> notebook: ``hello`` (pid), ``ready`` (device), ``failed`` (error info),
    ``done`` (``("ok", value)`` or ``("error", info)``).

Output framing
    A rank's stdout+stderr come through one pipe. After each task the rank writes
    ``END_MARK + task_id + "\\n"`` straight to fd 1, after its last output of that task, so the
    notebook can attribute every line to the task (cell) that printed it (``OutputSplitter``).
"""
from __future__ import annotations

import os
import pickle
import secrets
import select
import socket
import struct
from multiprocessing import connection as mpc

from .. import pickling


TOKEN_BYTES = 32
HANDSHAKE_S = 5.0  # a peer that stalls the challenge is dropped after this many seconds
END_MARK = b"\x1elabutils-task-end:"


def new_token() -> bytes:
    """A fresh random token (32 bytes from ``secrets``) for one generation of ranks."""
    return secrets.token_bytes(TOKEN_BYTES)


def dumps(obj) -> bytes:
    """cloudpickle ``obj`` (functions and classes from notebook cells go by value)."""
    return pickling.dumps(obj)


def pack(kind: str, task_id: int = 0, body: bytes = b"") -> bytes:
    return pickle.dumps((kind, task_id, body), protocol=pickle.HIGHEST_PROTOCOL)


def unpack(data: bytes) -> tuple[str, int, bytes]:
    kind, task_id, body = pickle.loads(data)
    return kind, task_id, body


def _set_recv_timeout(fd: int, seconds: float) -> None:
    """SO_RCVTIMEO on a socket fd (0 = block forever); applies to the ``read()`` Connection uses."""
    s = socket.socket(fileno=os.dup(fd))
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                     struct.pack("ll", int(seconds), int((seconds % 1) * 1e6)))
    finally:
        s.close()


class ControlServer:
    """Loopback listener that hands out only connections which proved they hold ``token``.

    Attributes:
        address: ``("127.0.0.1", port)`` for the ranks to connect to.
        refused: number of peers dropped for failing (or stalling) the challenge.
    """

    def __init__(self, token: bytes, host: str = "127.0.0.1"):
        self._token = token
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((host, 0))
        self._sock.listen(64)
        self.address = self._sock.getsockname()[:2]
        self.refused = 0

    def fileno(self) -> int:
        """Readable when a peer is waiting (``multiprocessing.connection.wait`` accepts us)."""
        return self._sock.fileno()

    def accept(self, timeout_s: float = 0.0):
        """Accept one peer and run the challenge; returns a ``Connection`` or None.

        None means: nobody connected within ``timeout_s``, or the peer failed the challenge (it is
        closed and counted in ``refused``). The challenge is bounded by ``HANDSHAKE_S`` so a silent
        peer cannot block the start of the pool.
        """
        if self._sock is None:
            raise OSError("the control server is closed")
        if not select.select([self._sock], [], [], timeout_s)[0]:
            return None
        try:
            sock, _ = self._sock.accept()
        except BlockingIOError:
            return None
        sock.setblocking(True)
        conn = mpc.Connection(sock.detach())
        _set_recv_timeout(conn.fileno(), HANDSHAKE_S)
        try:  # the same two steps as Listener(authkey=...).accept(), in the same order
            mpc.deliver_challenge(conn, self._token)
            mpc.answer_challenge(conn, self._token)
        except Exception:  # noqa: BLE001 - wrong digest, garbage, timeout, reset: refuse them all
            self.refused += 1
            conn.close()
            return None
        _set_recv_timeout(conn.fileno(), 0)
        return conn

    def close(self) -> None:
        """Stop listening (idempotent)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def connect(address, token: bytes) -> mpc.Connection:
    """Rank side: connect to the pool and answer/deliver the challenge (``AuthenticationError``
    if the token is wrong)."""
    return mpc.Client(tuple(address), authkey=token)


def end_marker(task_id: int) -> bytes:
    return END_MARK + str(task_id).encode() + b"\n"


class OutputSplitter:
    """Turns each rank's raw output bytes into lines and end-of-task marks.

    ``feed(rank, data)`` returns events in order: ``("line", rank, text)`` (text ends with a
    newline) and ``("end", rank, task_id)``. Text a task printed without a final newline is
    closed into a line at the task's end mark, so it is never glued to the next task's output.
    """

    def __init__(self):
        self._partial: dict[int, bytes] = {}

    def feed(self, rank: int, data: bytes) -> list[tuple]:
        buf = self._partial.get(rank, b"") + data
        events: list[tuple] = []
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line, buf = buf[:nl + 1], buf[nl + 1:]
            mark = line.find(END_MARK)
            if mark >= 0:
                if mark:
                    events.append(("line", rank, _text(line[:mark] + b"\n")))
                try:
                    events.append(("end", rank, int(line[mark + len(END_MARK):].strip())))
                except ValueError:  # someone else printed our mark: keep it as text
                    events.append(("line", rank, _text(line)))
            else:
                events.append(("line", rank, _text(line)))
        self._partial[rank] = buf
        return events

    def flush(self, rank: int) -> list[tuple]:
        """What is left of ``rank``'s output (the rank has exited), as a final line."""
        rest = self._partial.pop(rank, b"")
        return [("line", rank, _text(rest + b"\n"))] if rest else []


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")

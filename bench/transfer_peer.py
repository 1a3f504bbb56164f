"""bench/transfer.py's baselines' peer, a process of its own without an engine: a socket sender, a
Mooncake TE segment and a ucxx sender, each serving the same random bytes."""

import asyncio
import importlib
import socket
import threading
from multiprocessing.connection import Connection
from typing import Any

import numpy as np


def peer_main(conn: Connection, max_bytes: int) -> None:
    buf = np.random.default_rng(1).integers(0, 256, max_bytes, dtype=np.uint8)
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_socket_sender, args=(listener, buf), daemon=True).start()
    mooncake = _mooncake_segment(buf)
    conn.send((listener.getsockname()[1], mooncake))
    asyncio.run(_ucxx_sender(conn, buf))


def _socket_sender(listener: socket.socket, buf: np.ndarray) -> None:
    s, _ = listener.accept()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    view = buf.data
    head = bytearray(8)
    while True:
        if s.recv_into(head, 8, socket.MSG_WAITALL) < 8:
            return
        s.sendall(view[: int.from_bytes(head, "little")])


_MOONCAKE: list[Any] = []
"""Keeps the peer's Mooncake engine alive."""


def _mooncake_segment(buf: np.ndarray) -> tuple[int, int] | str:
    """(rpc port, buffer address) of a Mooncake TE serving `buf` over tcp, or why there is none."""
    try:
        # By name: an optional, bench-only peer that mypy must not need installed.
        mooncake: Any = importlib.import_module("mooncake.engine")
    except ImportError as e:
        return f"mooncake-transfer-engine-non-cuda is not installed ({e})"
    engine = mooncake.TransferEngine()
    if (rc := engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")) != 0:
        return f"TransferEngine.initialize(tcp, P2PHANDSHAKE) returned {rc}"
    if (rc := engine.register_memory(buf.ctypes.data, buf.nbytes)) != 0:
        return f"register_memory returned {rc}"
    _MOONCAKE.append(engine)
    return engine.get_rpc_port(), buf.ctypes.data


async def _ucxx_sender(conn: Connection, buf: np.ndarray) -> None:
    from radixmesh.node_agent.transfer import ucx_progress
    from radixmesh.node_agent.transfer.ucx_transport import import_ucxx

    ucxx = import_ucxx(loopback=True)
    loop = asyncio.get_running_loop()
    address = await loop.run_in_executor(None, conn.recv)
    ep = await ucxx.create_endpoint_from_worker_address(ucxx.get_ucx_address_from_buffer(address))
    ucx_progress.nudge(ucxx)
    conn.send("ready")
    while (cmd := await loop.run_in_executor(None, conn.recv)) is not None:
        nbytes, tag = cmd
        await ucx_progress.post_send(ucxx, ep, buf[:nbytes], tag)
    await ep.close()

"""Free TCP ports on 127.0.0.1 for the nodes of a local cluster."""

from __future__ import annotations

import socket
from contextlib import ExitStack

from fifolane.cluster.properties import NodePorts

__all__ = ["free_port", "pick_ports", "port_free"]


def free_port(host: str = "127.0.0.1", prefer: int | None = None) -> int:
    """A TCP port free on ``host`` right now (``prefer`` if it is free)."""
    if prefer is not None and port_free(host, prefer):
        return prefer
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_free(host: str, port: int) -> bool:
    """Can ``port`` be bound on ``host`` now?"""
    with socket.socket() as sock:
        # As the JVM binds: SO_REUSEADDR, so a port whose old connections sit in TIME_WAIT
        # (a cluster stopped a moment ago) counts as free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pick_ports(n: int, prefer_first: int | None, *, strict: bool = False,
               earlier: list[NodePorts] | None = None) -> list[NodePorts]:
    """2n distinct free ports; the sockets stay bound until all are chosen, so no duplicates.
    Each is the one ``earlier`` had if that is free, the first ``prefer_first`` if given and
    free (``strict``: or an OSError)."""
    wanted: list[int | None] = [None] * (2 * n)
    if earlier is not None and len(earlier) == n:
        wanted = [*(e.broker for e in earlier), *(e.controller for e in earlier)]
    if prefer_first:
        wanted[0] = prefer_first
    with ExitStack() as stack:
        chosen: list[int] = []
        for index, want in enumerate(wanted):
            sock = stack.enter_context(socket.socket())
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                if not want or want in chosen:
                    raise OSError(f"port {want} is chosen already")
                sock.bind(("127.0.0.1", want))
            except OSError:
                if strict and index == 0:
                    raise
                sock.bind(("127.0.0.1", 0))
            chosen.append(int(sock.getsockname()[1]))
    return [NodePorts(broker=chosen[i], controller=chosen[n + i]) for i in range(n)]

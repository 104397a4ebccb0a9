"""The c10d store on loopback when its host is loopback.

torch's TCPStore server listens on every interface: it binds the wildcard address and takes no bind
address, even when the job's rendezvous host is 127.0.0.1. Anyone who can reach the machine can then
talk to it, and torch unpickles the rendezvous state it reads from that store (README: Security). For a
loopback host, `install()` makes every store server this process starts bind its listening socket to
that address first and hand it over (TCPStore's `master_listen_fd`); any other host is left as torch does
it. Installed in the torchrun agent (launchers/node/agent.py) and in every rank's entry point, before torch
creates a store: the agent's rendezvous store, the workers' store and a rank's own are all covered.

The workers' store listens before its server starts (fsdp_jobs/ARCHITECTURE.md, pitfall 33): the agent that
forks rank 0 opens the listening socket (`listen_for_the_workers`) and the forked rank 0's store adopts it,
so the other ranks' first connect lands in its backlog instead of being refused and retried after c10d's
connect backoff.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from typing import Any, Optional

import torch.distributed as dist

_ARGS = ("host_name", "port", "world_size", "is_master", "timeout", "wait_for_workers", "multi_tenant",
         "master_listen_fd", "use_libuv")
_ORIGINAL = dist.TCPStore
# "FD:PORT": the listening socket the agent opened for the workers' store, which its forked ranks inherit
LISTENER_ENV = "FSDP_JOBS_STORE_LISTENER"
# "1" in the ranks of the node whose agent serves the rendezvous store, "0" in the others' (set by
# launchers/node/agent.py after each round): a preflight never has a hot spare replace that node
STORE_HOST_ENV = "FSDP_JOBS_STORE_HOST"


def loopback_address(host: str) -> Optional[tuple[int, str]]:
    """(family, address) when `host` names this machine's loopback (127.x, ::1, localhost), else None."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    for family, _, _, _, addr in infos:
        try:
            if ipaddress.ip_address(addr[0]).is_loopback:
                return family, str(addr[0])
        except ValueError:
            continue
    return None


def _listen(family: int, address: str, port: int) -> Optional[socket.socket]:
    """A socket listening on (address, port), set up as the store's own; None when the family is unavailable
    or the port is taken (a multi-tenant server already has it: let torch say so its way)."""
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store's own socket does
        if family == socket.AF_INET6 and address == "::":  # IPv4 beside IPv6, as torch's own server listens
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((address, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        return None
    return sock


def _listening_socket(host: str, port: int) -> Optional[socket.socket]:
    where = loopback_address(host)
    return _listen(where[0], where[1], port) if where else None


def listen_for_the_workers(host: str, port: int) -> Optional[socket.socket]:
    """The agent that forks rank 0: a socket listening where the workers' store will serve (`host`: loopback
    or not, as the store itself would listen: every interface otherwise), None when the port cannot be had
    (the store then binds it)."""
    where = loopback_address(host)
    if where is not None:
        return _listen(where[0], where[1], port)
    return _listen(socket.AF_INET6, "::", port) or _listen(socket.AF_INET, "", port)


def _inherited_listener(port: int) -> Optional[int]:
    """The listening socket this rank's agent opened for the store on `port` (LISTENER_ENV), taken once: its
    file descriptor, after checking that it is that socket (a spawned rank inherits the variable but not the
    socket, and the number may then be any other file). None otherwise."""
    fd, _, listened = os.environ.get(LISTENER_ENV, "").partition(":")
    if not fd.isdigit() or listened != str(port):
        return None
    del os.environ[LISTENER_ENV]
    try:
        sock = socket.socket(fileno=int(fd))
    except OSError:
        return None
    try:
        ours = bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)) and sock.getsockname()[1] == port
    except OSError:
        ours = False
    sock.detach()
    return int(fd) if ours else None


class LoopbackTCPStore(_ORIGINAL):  # type: ignore[misc, valid-type]
    """A TCPStore whose server, for a loopback host, listens on that address only; whose server adopts the
    socket its agent opened for it, and whose clients close their copy of that socket."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kw = {**dict(zip(_ARGS, args)), **kwargs}
        inherited = _inherited_listener(int(kw.get("port") or 0))
        if inherited is not None and kw.get("is_master") and kw.get("master_listen_fd") is None:
            kw["master_listen_fd"] = inherited  # the store owns it from here
        elif inherited is not None:
            os.close(inherited)  # another rank serves the store: this one must not hold its port open
        if kw.get("is_master") and kw.get("master_listen_fd") is None:
            sock = _listening_socket(str(kw["host_name"]), int(kw.get("port") or 0))
            if sock is not None:
                kw["port"] = sock.getsockname()[1]
                kw["master_listen_fd"] = sock.detach()  # the store owns it from here
        super().__init__(**kw)
        # whether this process serves the store (torch tries as server, then as client when the port is
        # taken): its agent must outlive the others' last calls (launchers/node/agent.py, pitfall 18)
        self.hosts_server = bool(kw.get("is_master"))


def install() -> None:
    """Every `TCPStore` name torch's modules hold, now and in modules imported later, becomes LoopbackTCPStore."""
    dist.TCPStore = LoopbackTCPStore
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.distributed") and getattr(module, "TCPStore", None) is _ORIGINAL:
            module.TCPStore = LoopbackTCPStore

"""cluster=local: the rendezvous port is chosen where no outgoing connection can take it.

It is chosen when the job is planned (so the dry run shows it) and node0's agent binds it seconds later. A
port from the kernel's ephemeral range could meanwhile become any outgoing connection's local port (a
busy machine makes thousands: the c10d store's and gloo's), and the job's agents then time out connecting
to a store nobody serves (ARCHITECTURE.md, pitfall 36)."""

from __future__ import annotations

import re
import socket

from fsdp_jobs.launchers.local import backend


def test_the_dry_run_shows_a_port_below_the_ephemeral_range(cli_here, tmp_path):
    r = cli_here("dry_run=true", f"run_root={tmp_path / 'runs'}", "nodes=2")
    assert r.returncode == 0, r.stderr
    ports = {int(p) for p in re.findall(r"--rdzv-endpoint=127\.0\.0\.1:(\d+)", r.stdout)}
    low, _ = backend.ephemeral_ports()
    port = ports.pop()
    assert not ports and port in backend.PORTS and port < low, r.stdout
    assert port not in (23306, 23790, 23800, 29400, 29500)  # the services beside jobs, torch's defaults


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_a_port_in_use_is_passed_over_and_none_is_given_twice(monkeypatch):
    taken = next(p for p in range(24000, 29000) if bindable(p) and bindable(p + 1) and bindable(p + 2))
    monkeypatch.setattr(backend, "PORTS", range(taken, taken + 3))
    monkeypatch.setattr(backend, "_given", set())
    with socket.socket() as held:
        held.bind(("127.0.0.1", taken))
        held.listen()
        first, second = backend.free_port(), backend.free_port()  # a replica job's two groups, say
    assert {first, second} == {taken + 1, taken + 2}
    third = backend.free_port()  # none left in the range: the kernel's pick, still not one given before
    assert third not in (first, second) and bindable(third)


def test_with_no_room_below_the_ephemeral_range_the_kernel_picks(monkeypatch):
    monkeypatch.setattr(backend, "ephemeral_ports", lambda: (1024, 65535))
    port = backend.free_port()
    assert bindable(port) and 1024 <= port <= 65535

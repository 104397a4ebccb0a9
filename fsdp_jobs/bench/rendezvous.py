"""`python -m fsdp_jobs.bench rendezvous [--nodes 8,16,32,64,128,256]`: torchrun's c10d rendezvous at N nodes,
simulated on this machine with torch's own code, to size the job's rendezvous timeouts (launchers/common.py).

Every simulated node is what one torchrun agent holds: a DynamicRendezvousHandler over a C10dRendezvousBackend
on its own TCPStore client, built through the same functions torchrun's registry calls
(c10d_rendezvous_backend.create_backend, then dynamic_rendezvous.create_handler) from the same
RendezvousParameters that `--rdzv-conf` fills, with its own node address (`local_addr`), so each is a distinct
node descriptor as on separate hosts. They are threads of this process (the store calls release the GIL;
the handlers' Python runs one thread at a time), all against one TCPStore server on loopback, made as the
agent that hosts the rendezvous makes it (is_host, multi_tenant, read_timeout). Measured:

- first round: N nodes call next_rendezvous at once (nnodes=N, so it completes when the N-th joins and
  last_call never waits);
- re-round: nnodes=N-1:N; after a first round of N, one node dies (its agent's keep-alive thread stops, as
  when its machine is lost) and the others call next_rendezvous again, as their agents do once their
  workers fail. They start once the lost node's keep-alive has expired (interval x attempts, which the
  round cannot end the old one before: a configured wait, reported on its own); the time is split into
  last_call (configured: N-1 < max_nodes) and the protocol's own part;
- the store round trips each round made (compare-and-set attempts, lost ones, pickled bytes of state):
  they depend much less on the machine than the times do, and explain them;
- at 1,024 and 8,192 nodes: the state's size, the store's measured cost of one losing compare-and-set of
  it, and what follows for a formed world and a round all agents enter at once (at_scale).

Then a simple model is fitted to the times and extrapolated to 1,024 and 8,192 nodes. Prints JSON.
Imports torch only inside functions (planning imports no torch: fsdp_jobs/ARCHITECTURE.md)."""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import gc
import json
import math
import os
import pickle
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterator, Optional

# on 2 cores the simulated rounds stop completing at 128-256 nodes (the agents' own Python shares them):
# the run stops at the first N whose round fails and reports it (`failed`)
DEFAULT_NODES = (8, 16, 32, 64, 128, 256)
EXTRAPOLATE_TO = (1024, 8192)
HOST = "127.0.0.1"
# torch hard-codes a 1 s sleep between two polls of the state by a node that waits (_Action.SYNC in
# dynamic_rendezvous.py), and caches the state for 1 s: a waiting node sees a change up to ~1 s late
TORCH_POLL_S = 1.0


@dataclass(frozen=True)
class SimConf:
    """The simulated agents' --rdzv-conf (whole seconds, as torchrun parses them: get_as_int). torchrun's
    defaults are join 600, last_call 30, close 30, heartbeat 5, keep_alive 5 s x 3 attempts. A short
    last_call, so that the re-round's configured waits stay small next to its protocol time; torch's
    keep-alive, the job's: a node that cannot get its heartbeat written for interval x attempts while the
    others contend is dropped by them and joins again, and past some number of contenders the round never
    completes (at_scale); a shorter keep-alive only makes that happen at fewer nodes. join_timeout: such a
    round does not recover (its participants stay on a plateau), so 3 minutes tell it."""

    join_timeout_s: int = 180
    last_call_s: int = 1
    keep_alive_s: int = 5
    keep_alive_attempts: int = 3
    read_timeout_s: int = 60

    def rdzv_conf(self) -> dict[str, Any]:
        return {"join_timeout": self.join_timeout_s, "last_call_timeout": self.last_call_s,
                "keep_alive_interval": self.keep_alive_s, "keep_alive_max_attempt": self.keep_alive_attempts,
                "read_timeout": self.read_timeout_s}


@dataclass
class _Counts:
    """Store round trips through the backends, summed over all nodes (a lock: every node's thread adds)."""

    gets: int = 0
    cas: int = 0
    cas_lost: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **k: int) -> None:
        with self.lock:
            for name, v in k.items():
                setattr(self, name, getattr(self, name) + v)

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "lock"}


@functools.lru_cache(maxsize=1)
def _counting_backend() -> type:
    """torch's RendezvousBackend interface around torch's C10dRendezvousBackend, counting each round trip;
    nothing else changes (a class made here: the module imports no torch at its top)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend

    class CountingBackend(RendezvousBackend):
        def __init__(self, inner: Any, counts: _Counts) -> None:
            self._inner, self._counts = inner, counts

        @property
        def name(self) -> str:
            return self._inner.name  # "c10d": the registry checks the handler's backend name

        def get_state(self) -> Any:
            got = self._inner.get_state()
            self._counts.add(gets=1, bytes_received=len(got[0]) if got else 0)
            return got

        def set_state(self, state: bytes, token: Any = None) -> Any:
            got = self._inner.set_state(state, token)
            self._counts.add(cas=1, cas_lost=int(got is not None and not got[2]), bytes_sent=len(state),
                             bytes_received=len(got[0]) if got else 0)
            return got

    return CountingBackend


@dataclass
class _Node:
    name: str
    store: Any
    handler: Any


@contextlib.contextmanager
def _agent_env() -> Iterator[None]:
    """The project's agents run with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (launchers/common.py runtime_env);
    with sharing on, each round's rank 0 would also open a TCPStore server on its node address, which
    here is a made-up name."""
    key, before = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
    os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _parallel(fn: Callable[[Any], Any], items: list[Any], timeout_s: float) -> tuple[float, list[tuple[float, Any]]]:
    """fn(item) on one thread per item, all released at once by a barrier. Returns the wall time from the
    release to the last return, and per item (its own seconds, its result or exception). Daemon threads:
    one stuck past timeout_s raises here, and closing the store server then ends it."""
    out: list[tuple[float, Any]] = [(math.nan, None)] * len(items)
    ends = [math.nan] * len(items)
    gate = threading.Barrier(len(items) + 1)

    def one(i: int) -> None:
        gate.wait()
        t0 = time.monotonic()
        try:
            r: Any = fn(items[i])
        except BaseException as e:  # noqa: BLE001  (reported per node, re-raised by the caller)
            r = e
        ends[i] = time.monotonic()
        out[i] = (ends[i] - t0, r)

    threads = [threading.Thread(target=one, args=(i,), daemon=True, name=f"rdzv-sim-{i}") for i in range(len(items))]
    for t in threads:
        t.start()
    gate.wait()
    start = time.monotonic()
    for t in threads:
        t.join(max(0.0, start + timeout_s - time.monotonic()))
    stuck = sum(t.is_alive() for t in threads)
    if stuck:
        raise TimeoutError(f"{stuck} of {len(items)} simulated nodes still busy after {timeout_s:.0f} s")
    return max(ends) - start, out


class RoundFailed(RuntimeError):
    """A simulated round did not complete; `record` holds its counts and progress for the report."""

    def __init__(self, message: str, record: dict[str, Any]) -> None:
        super().__init__(message)
        self.record = record


class _Watch:
    """Samples the rendezvous state once a second while a round runs, on the server's own connection: the
    participants over time ([seconds, round, complete, participants]) and how many joined nodes the
    others dropped before the round completed (keep-alive expired while they waited: they join again)."""

    def __init__(self, sim: _Sim) -> None:
        self.sim, self.samples, self.dropped = sim, [], 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="rdzv-sim-watch")

    def __enter__(self) -> _Watch:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        start, seen, last = time.monotonic(), set(), None
        while not self.stop.wait(TORCH_POLL_S):
            with contextlib.suppress(Exception):  # a sample lost to a busy store is no failure of the round
                st = self.sim.state()
                now = {d.addr for d in st.participants}
                if last is not None and st.round == last and not st.complete:
                    self.dropped += len(seen - now)
                seen, last = now, st.round
                self.samples.append([round(time.monotonic() - start, 1), st.round, st.complete, len(now)])


class _Sim:
    """One rendezvous: a TCPStore server and n agents' handlers (min_nodes..max_nodes), closed on exit."""

    def __init__(self, n: int, min_nodes: int, max_nodes: int, conf: SimConf, tag: str) -> None:
        self.n, self.min_nodes, self.max_nodes, self.conf = n, min_nodes, max_nodes, conf
        self.run_id = f"sim-{os.getpid()}-{tag}-{n}"
        self.counts = _Counts()
        self.server: Any = None
        self.nodes: list[_Node] = []

    def params(self, local_addr: Optional[str], is_host: bool) -> Any:
        from torch.distributed.elastic.rendezvous import RendezvousParameters

        return RendezvousParameters(backend="c10d", endpoint=f"{HOST}:{self.port}", run_id=self.run_id,
                                    min_nodes=self.min_nodes, max_nodes=self.max_nodes, local_addr=local_addr,
                                    is_host=str(is_host).lower(), **self.conf.rdzv_conf())

    def __enter__(self) -> _Sim:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _start(self) -> None:
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend

        for attempt in range(5):  # another process may take the free port before the server binds it
            self.port = _free_port()
            try:
                _, self.server = create_backend(self.params(None, is_host=True))
                break
            except Exception:
                if attempt == 4:
                    raise
        # the agents connect at once, as they do when a job starts; in parallel also because this sandbox's
        # resolver sometimes takes 5 s for the reverse lookup c10d makes of each new connection's address
        _, made = _parallel(self._make_node, [f"node-{i:05d}" for i in range(self.n)], 120 + self.n)
        self.nodes = [r for _, r in made if isinstance(r, _Node)]
        errors = [r for _, r in made if isinstance(r, BaseException)]
        if errors:
            raise RuntimeError(f"{len(errors)} of {self.n} simulated agents could not start") from errors[0]

    def _make_node(self, name: str) -> _Node:
        # torchrun's registry does exactly this (registry._create_c10d_handler), the count aside
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

        params = self.params(name, is_host=False)
        backend, store = create_backend(params)
        return _Node(name, store, create_handler(store, _counting_backend()(backend, self.counts), params))

    def round(self, nodes: list[_Node]) -> dict[str, Any]:
        """next_rendezvous on every node at once; raises RoundFailed with what was seen when one fails."""
        before, cpu0, load0 = self.counts.snapshot(), time.process_time(), os.getloadavg()[0]
        with _agent_env(), _Watch(self) as watch:
            wall, out = _parallel(lambda node: node.handler.next_rendezvous(), nodes,
                                  self.conf.join_timeout_s + 30)
        after = self.counts.snapshot()
        record = {"nodes": len(nodes), "wall_s": round(wall, 3), "cpu_s": round(time.process_time() - cpu0, 3),
                  "load_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
                  "store": {k: after[k] - before[k] for k in after}, "dropped_while_joining": watch.dropped,
                  "progress": watch.samples[::max(1, len(watch.samples) // 20)]}
        errors = [r for _, r in out if isinstance(r, BaseException)]
        if errors:
            raise RoundFailed(f"{len(errors)} of {len(nodes)} nodes failed the round: {errors[0]!r}",
                              record) from errors[0]
        per_node = [s for s, _ in out]
        return {**record, "node_s": {"median": round(statistics.median(per_node), 3), "max": round(max(per_node), 3)},
                "ranks": [r.rank for _, r in out], "world_sizes": [r.world_size for _, r in out],
                "state_bytes": self.state_bytes()}

    def state(self) -> Any:
        """The rendezvous state as the store holds it (read on the server's own connection: not counted)."""
        raw = self.server.get(f"torch.rendezvous.{self.run_id}")
        return pickle.loads(base64.b64decode(raw))

    def state_bytes(self) -> int:
        return len(pickle.dumps(self.state()))

    def kill(self, node: _Node) -> float:
        """The node's machine is lost: its agent's keep-alive thread stops (torch's handler has no public
        way to stop heartbeats without closing the whole rendezvous, which a lost node never does).
        Returns the monotonic time at which the others may drop it: last heartbeat + interval x attempts."""
        node.handler._stop_heartbeats()
        last = next(t for desc, t in self.state().last_heartbeats.items() if desc.addr == node.name)
        expiry = last + self.conf.keep_alive_s * self.conf.keep_alive_attempts * timedelta(seconds=1)
        return time.monotonic() + (expiry - datetime.now(timezone.utc)).total_seconds()

    def close(self) -> None:
        """Stop every node's keep-alive thread, then drop the clients and the server (TCPStore has no close:
        its sockets close when the object goes); a thread still in a store call then fails and ends."""
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.handler._stop_heartbeats()  # what handler.shutdown() does first, without closing the rendezvous
        self.nodes.clear()
        self.server = None
        gc.collect()


def _first_round(n: int, conf: SimConf) -> dict[str, Any]:
    with _Sim(n, n, n, conf, "first") as sim:
        return sim.round(sim.nodes)


def _re_round(n: int, conf: SimConf) -> dict[str, Any]:
    """nnodes=N-1:N: a round of N, one node lost, the N-1 others' next round."""
    with _Sim(n, n - 1, n, conf, "again") as sim:
        first = sim.round(sim.nodes)
        if sorted(first["world_sizes"]) != [n] * n:  # the N-th joined after last_call: not the case measured
            raise RuntimeError(f"the round before the loss formed with {first['world_sizes'][0]} of {n} nodes")
        lost, others = sim.nodes[-1], sim.nodes[:-1]
        # the next round cannot close the old one before the lost node's keep-alive expires (the others
        # leave it; it only ends when no participant is left). That is a configured wait, reported on its
        # own: the others start once it has passed (their workers usually notice the loss later than
        # that), so that it does not hide the protocol's time (the others leaving the old round at once
        # overlap with it otherwise). The first of their writes then drops the lost node.
        time.sleep(max(0.0, sim.kill(lost) - time.monotonic()) + 0.2)
        again = sim.round(others)
        # then it waits last_call because N-1 < max_nodes: configured; the rest is the protocol's own time
        again.update({"keep_alive_expiry_s": conf.keep_alive_s * conf.keep_alive_attempts,
                      "configured_wait_s": conf.last_call_s,
                      "protocol_s": round(again["wall_s"] - conf.last_call_s, 3)})
        return {"round_before_loss": first, "re_round": again}


def simulate_round(n: int, conf: Optional[SimConf] = None, rerun: bool = True) -> dict[str, Any]:
    """N simulated agents' first rendezvous round (nnodes=N), and with `rerun` (N >= 2) the re-round of N-1
    after one is lost (nnodes=N-1:N). JSON-able; raises when a round fails or times out."""
    conf = conf or SimConf()
    if n < 1:
        raise ValueError(f"a rendezvous needs at least 1 node, not {n}")
    result: dict[str, Any] = {"n": n, "first_round": _first_round(n, conf)}
    if rerun and n >= 2:
        result.update(_re_round(n, conf))
    return result


# one basis function each, fitted as a + b * f(N) (the a: torch's ~1 s poll floor and thread start-up)
MODELS: dict[str, Callable[[float], float]] = {
    "linear": lambda n: n,
    "n_log_n": lambda n: n * math.log2(n),
    "quadratic": lambda n: n * n,
}


def _least_squares(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """a, b of y = a + b x (b = 0 when every x is the same)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def fit(ns: list[int], ys: list[float], to: tuple[int, ...] = EXTRAPOLATE_TO) -> dict[str, Any]:
    """Each MODELS entry fitted to (N, y), its RMS residual and its values at `to`; `best` has the smallest
    residual; `power` is the exponent k of y ~ c N^k over the largest half of the Ns (how fast it grows
    where it matters, floor aside)."""
    models = {}
    for name, f in MODELS.items():
        a, b = _least_squares([f(n) for n in ns], ys)
        rms = math.sqrt(statistics.fmean([(a + b * f(n) - y) ** 2 for n, y in zip(ns, ys)]))
        models[name] = {"a": round(a, 6), "b": round(b, 9), "rms": round(rms, 4),
                        "at": {str(t): round(a + b * f(t), 1) for t in to}}
    top = [(n, y) for n, y in zip(ns, ys) if y > 0][-max(2, len(ns) // 2):]
    k = _least_squares([math.log(n) for n, _ in top], [math.log(y) for _, y in top])[1] if len(top) > 1 else None
    return {"models": models, "best": min(models, key=lambda m: models[m]["rms"]),
            "power": None if k is None else round(k, 2)}


def bench_rendezvous(ns: list[int], conf: Optional[SimConf] = None, rerun: bool = True) -> dict[str, Any]:
    """simulate_round for each N (smallest first), a table of them, and the fits of the first round's time,
    the re-round's protocol time and the store round trips, extrapolated to EXTRAPOLATE_TO."""
    conf = conf or SimConf()
    ns = sorted(set(ns))
    machine = {"cpus": os.cpu_count(), "load_1m_before": round(os.getloadavg()[0], 2)}
    runs, failed = [], None
    for n in ns:
        try:
            runs.append(simulate_round(n, conf, rerun))
        except RoundFailed as e:  # a finding, not a crash: a larger N would not do better
            failed = {"n": n, "error": str(e), **e.record}
            break
        finally:
            print(f"rendezvous: N={n} done", file=sys.stderr, flush=True)  # a long run shows where it is
    machine["load_1m_after"] = round(os.getloadavg()[0], 2)
    table = [_row(r) for r in runs]
    ns = [r["n"] for r in runs]
    fits: dict[str, Any] = {}
    for key in ("first_round_s", "first_round_cas", "state_bytes", "re_round_protocol_s", "re_round_cas"):
        if len(ns) >= 2 and all(key in r for r in table):  # a fit needs two Ns
            fits[key] = fit(ns, [r[key] for r in table])
    per_node = fits["state_bytes"]["models"]["linear"] if "state_bytes" in fits else None
    scale = {str(t): at_scale(t, per_node["a"] + per_node["b"] * t, conf) for t in EXTRAPOLATE_TO} if per_node else {}
    return {"machine": machine, "conf": {**conf.rdzv_conf(), "torch_poll_s": TORCH_POLL_S},
            "table": table, "failed": failed, "fits": fits, "at_scale": scale, "runs": runs}


def cas_attempt_ms(state_bytes: int, clients: int = 4, seconds: float = 2.0) -> float:
    """Milliseconds of the store server per losing compare-and-set of a state this size (base64, as the
    backend sends it: the expected and the new value go, the stored one comes back), with `clients`
    connections keeping it busy. On a real cluster the agents' own Python runs on their own machines, so
    a round where all of them contend is bound by this: each write that wins costs one losing attempt
    of every other contender."""
    from torch.distributed import TCPStore

    wire = int(state_bytes * 4 / 3)
    # its socket closes when this function returns (TCPStore has no close); the clients' with their threads
    server = TCPStore(HOST, 0, is_master=True, multi_tenant=True, timeout=timedelta(seconds=60))
    server.set("state", b"s" * wire)
    port, done = server.port, [0] * clients
    expected, new = "e" * wire, "n" * wire  # never the stored value: every attempt loses

    def lose(i: int) -> None:
        client = TCPStore(HOST, port, is_master=False, timeout=timedelta(seconds=60))
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            client.compare_set("state", expected, new)
            done[i] += 1

    wall, _ = _parallel(lose, list(range(clients)), seconds + 120)
    return 1e3 * wall / max(1, sum(done))


def at_scale(n: int, state_bytes: float, conf: SimConf, monitor_interval_s: float = 1.0) -> dict[str, Any]:
    """What n agents in one torchrun world ask of the store host, from the state's size and the measured
    cost of a losing compare-and-set of it:
    - formed world, every second: every agent's monitor loop reads the whole state (num_nodes_waiting, each
      monitor interval: the project's torchrun flags say 1 s) and writes it back with its heartbeat
      (keep_alive_interval);
    - a round all n enter at once (a re-round after a failure: their agents see it within a second): each
      winning write costs one losing attempt of every other contender (the server takes them about in
      turn), so about n^2/2 attempts for n writes: `all_at_once_store_s`. A node that joined early and
      whose heartbeat comes due queues behind the rest for about as long, and is dropped as dead once that
      exceeds keep_alive_interval x (attempts - 1): with more than `max_contenders` (sqrt(2 window / t))
      the round drops live nodes about as fast as they join and does not complete (this machine, where
      the agents' Python shares 2 cores and an attempt costs ~3 ms: 256 nodes, `failed`). An upper
      estimate: the simulated rounds counted 3-5x fewer attempts than n^2/2 per phase (torch's 0-0.3 s
      random start in a first round, and threads that do not all contend at once)."""
    wire = state_bytes * 4 / 3
    t_ms = cas_attempt_ms(int(state_bytes))
    reads, writes = n / monitor_interval_s, n / conf.keep_alive_s
    window_s = conf.keep_alive_s * (conf.keep_alive_attempts - 1)
    return {"state_kb": round(wire / 1e3, 1), "reads_per_s": reads, "heartbeat_writes_per_s": writes,
            "steady_mb_per_s": round((reads * wire + writes * 3 * wire) / 1e6, 1),
            "cas_attempt_ms": round(t_ms, 4), "all_at_once_attempts": n * n // 2,
            "all_at_once_store_s": round(n * n / 2 * t_ms / 1e3, 1), "keep_alive_window_s": window_s,
            "max_contenders": int(math.sqrt(2 * window_s * 1e3 / t_ms))}


def _row(r: dict[str, Any]) -> dict[str, Any]:
    """The table's line for one N (the full round records stay in `runs`)."""
    first = r["first_round"]
    row = {"n": r["n"], "first_round_s": first["wall_s"], "first_round_cpu_s": first["cpu_s"],
           "first_round_cas": first["store"]["cas"], "first_round_cas_lost": first["store"]["cas_lost"],
           "first_round_dropped": first["dropped_while_joining"], "first_round_load_1m": first["load_1m"][1],
           "state_bytes": first["state_bytes"]}
    if "re_round" in r:
        again = r["re_round"]
        row.update({"re_round_s": again["wall_s"], "re_round_configured_s": again["configured_wait_s"],
                    "re_round_protocol_s": again["protocol_s"], "re_round_cas": again["store"]["cas"],
                    "re_round_cas_lost": again["store"]["cas_lost"]})
    return row


def _add_arguments(p: argparse.ArgumentParser) -> None:
    d = SimConf()
    p.add_argument("--nodes", default=",".join(map(str, DEFAULT_NODES)),
                   help="comma-separated N (simulated agents) to measure, e.g. 8,16,32")
    p.add_argument("--no-rerun", action="store_true", help="first rounds only (no re-round after a loss)")
    p.add_argument("--join-timeout", type=int, default=d.join_timeout_s)
    p.add_argument("--last-call", type=int, default=d.last_call_s, help="last_call_timeout of the re-round (s)")
    p.add_argument("--keep-alive", type=int, default=d.keep_alive_s, help="keep_alive_interval (s)")
    p.add_argument("--keep-alive-attempts", type=int, default=d.keep_alive_attempts)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """`rendezvous` on the benchmark CLI's subparsers (python -m fsdp_jobs.bench rendezvous ...)."""
    p = sub.add_parser("rendezvous", help="torchrun's c10d rendezvous at N simulated nodes (issue #28)")
    _add_arguments(p)
    return p


def run(args: argparse.Namespace) -> int:
    ns = [int(x) for x in str(args.nodes).split(",") if x.strip()]
    conf = SimConf(join_timeout_s=args.join_timeout, last_call_s=args.last_call, keep_alive_s=args.keep_alive,
                   keep_alive_attempts=args.keep_alive_attempts)
    print(json.dumps(bench_rendezvous(ns, conf, rerun=not args.no_rerun), indent=2))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m fsdp_jobs.bench.rendezvous")
    _add_arguments(parser)
    sys.exit(run(parser.parse_args()))

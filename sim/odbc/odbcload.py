#!/usr/bin/env python3
"""odbcload: a TDS workload through Microsoft ODBC Driver 18 (as bundled by
the mssql-python package), the counterpart of the simulator's `sqlclient`.

N sessions, each its own connection (autocommit off, the driver's default,
so commits are transaction manager requests) in its own thread: SELECT @@SPID
once, then at its share of the total rate a parameterised UPDATE (an RPC) and
a commit, one outstanding request at a time. Prints one JSON line with the
shape of sqlclient's: transactions, errors by kind, tps, latency percentiles
in microseconds, and per session its SPID (from SELECT @@SPID), its client
TCP port (from the kernel: /proc/self/fd against /proc/self/net/tcp{,6}), the
Encrypt= mode and each call's time (`request_latencies_us`: the SELECT, each
UPDATE and each commit, one request each). With --mars the connections
turn MARS on (SQL_COPT_SS_MARS_ENABLED: mssql-python takes no
MARS_Connection= keyword), so everything after the login travels inside SMP.
Exits 1 if no transaction succeeded.

The password is taken from SQLCLIENT_PASSWORD (as sqlclient does), never argv.
"""

import argparse
import json
import math
import os
import sys
import threading
import time

# ODBC Driver 18, not mssql-python's newer Rust driver: set before the import.
os.environ["MSSQL_PYTHON_NATIVE_PROVIDER"] = "msodbcsql18"

import mssql_python  # noqa: E402  (the provider must be chosen first)

ENCRYPT_MODES = ("yes", "strict", "optional", "no")
TCP_ESTABLISHED = "01"


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="odbcload",
        description="A TDS workload through Microsoft ODBC Driver 18 (mssql-python); "
                    "prints one JSON line.",
    )
    p.add_argument("--server", required=True, help="HOST:PORT")
    p.add_argument("--sessions", type=int, default=1)
    p.add_argument("--rate", type=float, default=100.0,
                   help="total transactions per second over all sessions (0 = unpaced)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds to send for")
    p.add_argument("--encrypt", choices=ENCRYPT_MODES, default="yes",
                   help="the connection string's Encrypt= (TrustServerCertificate=yes)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds for a login and for each statement")
    p.add_argument("--server-certificate",
                   help="the server's certificate (PEM), for Encrypt=strict, where the "
                        "driver ignores TrustServerCertificate (sqlservr --certificate-out)")
    p.add_argument("--mars", action="store_true",
                   help="turn MARS on for each connection (SQL_COPT_SS_MARS_ENABLED)")
    p.add_argument("--user", default="stalltrace")
    p.add_argument("--database", default="stalltrace")
    a = p.parse_args(argv)
    if a.sessions < 1:
        p.error("--sessions must be at least 1")
    if not (a.rate >= 0 and math.isfinite(a.rate)):
        p.error("--rate must be a number >= 0")
    if not (a.duration > 0 and a.timeout > 0):
        p.error("--duration and --timeout must be positive")
    if a.encrypt == "strict" and not a.server_certificate:
        p.error("--encrypt strict needs --server-certificate (the driver verifies it)")
    host, sep, port = a.server.rpartition(":")
    if not sep or not port.isdigit():
        p.error("--server must be HOST:PORT")
    a.host, a.port = host.strip("[]"), int(port)
    return a


# msodbcsql's SQL_COPT_SS_MARS_ENABLED and SQL_MARS_ENABLED_YES (msodbcsql.h).
SQL_COPT_SS_MARS_ENABLED = 1224
SQL_MARS_ENABLED_YES = 1


def connection_attributes(a):
    return {SQL_COPT_SS_MARS_ENABLED: SQL_MARS_ENABLED_YES} if a.mars else None


def connection_string(a):
    parts = [
        f"Server={a.host},{a.port}",
        f"UID={a.user}",
        # The driver refuses an empty PWD; the simulator takes any password.
        f"PWD={{{os.environ.get('SQLCLIENT_PASSWORD') or 'stalltrace'}}}",
        f"Database={a.database}",
        f"Encrypt={a.encrypt}",
        "TrustServerCertificate=yes",
    ]
    if a.server_certificate:
        parts.append(f"ServerCertificate={a.server_certificate}")
    return ";".join(parts)


def socket_inodes():
    """Inodes of this process's sockets, from /proc/self/fd."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def connections_to(port):
    """{inode: local port} of established TCP connections to remote `port`,
    from this process's network namespace's tables."""
    out = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], int(fields[9])
            if state == TCP_ESTABLISHED and int(remote.rsplit(":", 1)[1], 16) == port:
                out[inode] = int(local.rsplit(":", 1)[1], 16)
    return out


class Result:
    def __init__(self):
        self.latencies_us = []
        self.errors = {}
        self.samples = {}
        self.logins = []

    def error(self, kind, exc, counted=True):
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.samples.setdefault(kind, f"{type(exc).__name__}: {exc}")
        if counted and self.logins:
            self.logins[-1]["errors"] += 1


def error_kind(exc):
    if isinstance(exc, mssql_python.OperationalError):
        return "disconnected"
    if isinstance(exc, mssql_python.DatabaseError):
        return "server"
    return "io"


# Connects one at a time, so that the one new socket to the server's port is
# this session's: the oracle for the client port is the kernel's table.
CONNECT_LOCK = threading.Lock()
CLAIMED = set()


def login(a, slot, res):
    with CONNECT_LOCK:
        try:
            conn = mssql_python.connect(connection_string(a), timeout=max(1, int(a.timeout)),
                                        attrs_before=connection_attributes(a))
        except Exception as exc:  # noqa: BLE001 (every failure is a connect error)
            res.error("connect", exc, counted=False)
            return None
        mine = socket_inodes()
        new = {i: p for i, p in connections_to(a.port).items() if i in mine and i not in CLAIMED}
        if len(new) != 1:
            conn.close()
            res.error("connect", RuntimeError(f"{len(new)} new sockets to port {a.port}"),
                      counted=False)
            return None
        inode, client_port = next(iter(new.items()))
        CLAIMED.add(inode)
    conn.timeout = max(1, int(a.timeout))
    timed = []
    try:
        cur = conn.cursor()
        spid = int(timed_call(timed, lambda: (cur.execute("SELECT @@SPID"), cur.fetchone())[1])[0])
        timed_call(timed, conn.commit)
    except Exception as exc:  # noqa: BLE001
        res.error("connect", exc, counted=False)
        conn.close()
        return None
    res.logins.append({"session": slot, "spid": spid, "client_port": client_port,
                       "encrypt": a.encrypt, "transactions": 0, "errors": 0,
                       "request_latencies_us": timed})
    return conn, cur


def timed_call(timed, call):
    """call(), with its time in microseconds appended to `timed`: one
    request and its response, as this client waited for it (the driver's
    own time and Python's included)."""
    t0 = time.perf_counter_ns()
    out = call()
    timed.append((time.perf_counter_ns() - t0) // 1000)
    return out


def run_slot(a, slot, barrier, res):
    session = login(a, slot, res)
    barrier.wait()
    start = time.monotonic()
    deadline = start + a.duration
    if a.rate > 0:
        interval, offset = a.sessions / a.rate, slot / a.rate
    else:
        interval, offset = 0.0, 0.0
    k = 0
    while True:
        # A session that fell behind sends at once until it has caught up.
        due = start + offset + interval * k
        k += 1
        now = time.monotonic()
        if due >= deadline or now >= deadline:
            break
        if due > now:
            time.sleep(due - now)
        if session is None:
            session = login(a, slot, res)
            if session is None:
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            continue
        conn, cur = session
        t0 = time.perf_counter()
        timed = res.logins[-1]["request_latencies_us"]
        try:
            timed_call(timed, lambda: cur.execute("UPDATE t SET v = v + 1 WHERE id = ?", slot + 1))
            timed_call(timed, conn.commit)
        except Exception as exc:  # noqa: BLE001
            kind = error_kind(exc)
            res.error(kind, exc)
            if kind != "server":
                try:
                    conn.close()
                except Exception:  # noqa: BLE001 (already broken)
                    pass
                session = None
            continue
        res.latencies_us.append(int((time.perf_counter() - t0) * 1e6))
        res.logins[-1]["transactions"] += 1
    if session is not None:
        try:
            session[0].close()
        except Exception:  # noqa: BLE001
            pass


def percentile(sorted_values, q):
    """Nearest-rank percentile (0 when empty), as sqlclient computes it."""
    if not sorted_values:
        return 0
    rank = math.ceil(q * len(sorted_values))
    return sorted_values[min(max(rank, 1), len(sorted_values)) - 1]


def main(argv):
    a = parse_args(argv)
    results = [Result() for _ in range(a.sessions)]
    barrier = threading.Barrier(a.sessions + 1)
    threads = [threading.Thread(target=run_slot, args=(a, i, barrier, results[i]),
                                name=f"session{i}") for i in range(a.sessions)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.monotonic()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start

    lat = sorted(x for r in results for x in r.latencies_us)
    by_kind, samples, sessions = {}, {}, []
    for r in results:
        for k, n in r.errors.items():
            by_kind[k] = by_kind.get(k, 0) + n
        for k, s in r.samples.items():
            samples.setdefault(k, s)
        sessions.extend(r.logins)
    n = len(lat)
    report = {
        "server": a.server,
        "driver": "Microsoft ODBC Driver 18 (mssql-python)",
        "encrypt": a.encrypt,
        "sessions_requested": a.sessions,
        "rate_tps": a.rate,
        "duration_s": a.duration,
        "elapsed_s": round(elapsed, 3),
        "transactions": n,
        "errors": sum(by_kind.values()),
        "errors_by_kind": dict(sorted(by_kind.items())),
        "error_samples": dict(sorted(samples.items())),
        "tps": round(n / a.duration, 3),
        "mean_us": sum(lat) // n if n else 0,
        "p50_us": percentile(lat, 0.50),
        "p90_us": percentile(lat, 0.90),
        "p99_us": percentile(lat, 0.99),
        "max_us": lat[-1] if lat else 0,
        "sessions": sessions,
    }
    print(json.dumps(report), flush=True)
    return 0 if n > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The cluster under test: holdfast instances on one database (PostgreSQL or
an SQLite file), the faults done to them (kill -9, a PostgreSQL restart), the
database read back directly, `holdfast audit`, and everything that must be
undone at exit."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
import uuid

from .common import (HOLD_MAX_TOTAL_SECONDS, HOLD_SECONDS_MAX, HOST, ROOT, log, parse_ts)

PG_HOST = "127.0.0.1"
# Another cluster than the machine's own (say, a private one a developer runs
# beside other work): its port, and its data directory for pg_ctl.
PG_PORT = int(os.environ.get("CHAOS_PG_PORT", "5432"))
PG_DATA = os.environ.get("CHAOS_PG_DATA")
PG_USER = "postgres"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def tail(path, lines=30):
    try:
        with open(path, "rb") as f:
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------
# Everything that must be undone at exit, whatever happens.
# --------------------------------------------------------------------------


class Cleanup:
    def __init__(self):
        self.lock = threading.RLock()
        self.callbacks: list = []
        self.procs: list[subprocess.Popen] = []
        self.pg_databases: list[str] = []
        self.pg_touched = False
        self.done = False

    def add_proc(self, proc):
        with self.lock:
            self.procs.append(proc)

    def run(self):
        with self.lock:
            if self.done:
                return
            self.done = True
            for proc in self.procs:
                if proc.poll() is None:
                    try:
                        proc.kill()
                    except OSError:
                        pass
            for proc in self.procs:
                try:
                    proc.wait(timeout=10)
                except Exception:
                    pass
            for callback in self.callbacks:
                try:
                    callback()
                except Exception as e:  # noqa: BLE001
                    log(f"cleanup step failed: {e}")
            if self.pg_touched and not pg_ready():
                log("PostgreSQL is not accepting connections; starting it")
                pg_ctl("start")
                for _ in range(60):
                    if pg_ready():
                        break
                    time.sleep(0.5)
            for db in self.pg_databases:
                try:
                    psql(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)', timeout=30)
                    log(f"dropped database {db}")
                except Exception as e:  # noqa: BLE001
                    log(f"could not drop database {db}: {e}")


CLEANUP = Cleanup()


# --------------------------------------------------------------------------
# PostgreSQL helpers
# --------------------------------------------------------------------------


def _pg_env():
    env = dict(os.environ)
    env["PGCONNECT_TIMEOUT"] = "5"
    env.pop("PGPASSWORD", None)
    return env


def psql(sql: str, db: str = "postgres", timeout: float = 60, port: int | None = None):
    r = subprocess.run(
        ["psql", "-X", "-q", "-h", PG_HOST, "-p", str(port or PG_PORT), "-U", PG_USER, "-d", db,
         "-v", "ON_ERROR_STOP=1", "-tA", "-F", "\t", "-c", sql],
        capture_output=True, text=True, timeout=timeout, env=_pg_env(),
    )
    if r.returncode != 0:
        raise RuntimeError(f"psql failed ({r.returncode}): {r.stderr.strip()}")
    return [line.split("\t") for line in r.stdout.splitlines() if line != ""]


def pg_ready() -> bool:
    try:
        r = subprocess.run(["pg_isready", "-q", "-h", PG_HOST, "-p", str(PG_PORT)],
                           timeout=10, env=_pg_env())
        return r.returncode == 0
    except Exception:  # noqa: BLE001
        return False


def pg_version() -> str:
    versions = sorted(os.listdir("/etc/postgresql"))
    for v in versions:
        if os.path.isdir(os.path.join("/etc/postgresql", v, "main")):
            return v
    raise RuntimeError("no PostgreSQL cluster 'main' under /etc/postgresql")


def pg_ctl(action: str, timeout: float = 120) -> subprocess.CompletedProcess:
    if PG_DATA:
        binary = os.path.join("/usr/lib/postgresql", pg_version(), "bin", "pg_ctl")
        command = ["runuser", "-u", "postgres", "--", binary, "-D", PG_DATA, "-w", action]
    else:
        command = ["pg_ctlcluster", "--skip-systemctl-redirect", pg_version(), "main", action]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


class Replicas:
    """A primary and its synchronous streaming standby: two private clusters
    of this run, in a directory of their own (owned by the postgres user).
    Every COMMIT the primary acknowledges is on the standby's disk first
    (`synchronous_commit = on`, the standby named in
    `synchronous_standby_names`), so promoting the standby loses nothing a
    client was told. The failover is done as Patroni does it once its leader
    key expires: the primary is gone (here: stopped `immediate`), the standby
    is promoted (`pg_ctl promote`) and, with no standby left for it, the new
    primary stops waiting for one."""

    def __init__(self):
        self.bin = os.path.join("/usr/lib/postgresql", pg_version(), "bin")
        self.dir = tempfile.mkdtemp(prefix="holdfast-replicas-")
        shutil.chown(self.dir, "postgres")
        self.primary_port = free_port()
        self.standby_port = free_port()
        self.primary = os.path.join(self.dir, "primary")
        self.standby = os.path.join(self.dir, "standby")
        self.primary_alive = False
        CLEANUP.callbacks.append(self.remove)

    def _run(self, *args, timeout=120):
        r = subprocess.run(["runuser", "-u", "postgres", "--", *args], capture_output=True,
                           text=True, timeout=timeout, cwd=self.dir)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): "
                               f"{(r.stderr or r.stdout).strip()}")
        return r

    def _pg_ctl(self, data, *args, timeout=120):
        return self._run(os.path.join(self.bin, "pg_ctl"), "-D", data, "-w",
                         "-l", data + ".log", *args, timeout=timeout)

    def setup(self):
        self._run(os.path.join(self.bin, "initdb"), "-D", self.primary, "-U", PG_USER,
                  "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8")
        with open(os.path.join(self.primary, "postgresql.conf"), "a") as conf:
            conf.write(f"\nport = {self.primary_port}\nlisten_addresses = '{PG_HOST}'\n"
                       "unix_socket_directories = ''\nwal_level = replica\n"
                       "max_wal_senders = 4\nmax_connections = 200\n"
                       "synchronous_standby_names = 'FIRST 1 (standby1)'\n"
                       "synchronous_commit = on\nfsync = on\n")
        with open(os.path.join(self.primary, "pg_hba.conf"), "a") as hba:
            hba.write(f"host replication {PG_USER} {PG_HOST}/32 trust\n")
        self._pg_ctl(self.primary, "start")
        self.primary_alive = True
        self._run(os.path.join(self.bin, "pg_basebackup"), "-h", PG_HOST, "-p",
                  str(self.primary_port), "-U", PG_USER, "-D", self.standby, "-R",
                  "-X", "stream", "-c", "fast")
        with open(os.path.join(self.standby, "postgresql.auto.conf"), "a") as conf:
            conf.write(f"\nport = {self.standby_port}\n"
                       f"primary_conninfo = 'host={PG_HOST} port={self.primary_port} "
                       f"user={PG_USER} application_name=standby1'\n")
        self._pg_ctl(self.standby, "start")
        for _ in range(100):
            rows = psql("SELECT sync_state FROM pg_stat_replication", port=self.primary_port)
            if rows and rows[0][0] == "sync":
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("the standby did not become a synchronous standby")
        log(f"primary on {self.primary_port}, synchronous standby on {self.standby_port}")

    def url(self, db):
        return (f"postgres://{PG_USER}@{PG_HOST}:{self.primary_port},{PG_HOST}:"
                f"{self.standby_port}/{db}?target_session_attrs=read-write")

    def kill_primary(self):
        self._pg_ctl(self.primary, "-m", "immediate", "stop")
        self.primary_alive = False

    def promote(self):
        """Promotes the standby, then, as Patroni does when no synchronous
        standby is left (`synchronous_mode_strict` off), stops waiting for
        one: else every COMMIT on the new primary would wait for a standby
        that does not exist, holding its locks."""
        self._pg_ctl(self.standby, "promote")
        psql("ALTER SYSTEM SET synchronous_standby_names = ''", port=self.standby_port)
        psql("SELECT pg_reload_conf()", port=self.standby_port)

    def remove(self):
        for data in (self.standby, self.primary):
            if os.path.exists(os.path.join(data, "postmaster.pid")):
                try:
                    self._pg_ctl(data, "-m", "immediate", "stop", timeout=60)
                except Exception as e:  # noqa: BLE001
                    log(f"could not stop the cluster in {data}: {e}")
        shutil.rmtree(self.dir, ignore_errors=True)


# --------------------------------------------------------------------------
# holdfast instances
# --------------------------------------------------------------------------


class Instance:
    def __init__(self, name, binary, db_url, workdir, late_commit="refund"):
        self.name = name
        self.binary = binary
        self.db_url = db_url
        self.port = free_port()
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.proc = None
        self.starts = 0
        self.late_commit = late_commit
        # (start time, HOLDFAST_LATE_COMMIT) of each start: which mode served
        # a request sent at a given time.
        self.modes: list[tuple[float, str]] = []

    def mode_at(self, t: float) -> str:
        mode = self.modes[0][1] if self.modes else self.late_commit
        for start, m in self.modes:
            if start <= t:
                mode = m
        return mode

    def env(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOLDFAST_")}
        env.update({
            "HOLDFAST_DATABASE_URL": self.db_url,
            "HOLDFAST_BIND": f"{HOST}:{self.port}",
            "HOLDFAST_JANITOR_INTERVAL_SECONDS": "1",
            "HOLDFAST_HOLD_SECONDS_MIN": "1",
            "HOLDFAST_HOLD_SECONDS": "5",
            "HOLDFAST_HOLD_SECONDS_MAX": str(HOLD_SECONDS_MAX),
            "HOLDFAST_HOLD_MAX_TOTAL_SECONDS": str(HOLD_MAX_TOTAL_SECONDS),
            "HOLDFAST_LATE_COMMIT": self.late_commit,
            "HOLDFAST_MAX_HOLDS_PER_BUYER": "0",
            # A hand-off's hold lapses within the run, giving the next waiter its turn.
            "HOLDFAST_WAITLIST_HOLD_SECONDS": "3",
            "RUST_LOG": "warn",
        })
        return env

    def start(self):
        logf = open(self.log_path, "ab")
        logf.write(f"\n==== start {self.starts + 1} at {time.time():.3f} "
                   f"(HOLDFAST_LATE_COMMIT={self.late_commit})\n".encode())
        logf.flush()
        self.proc = subprocess.Popen([self.binary, "serve"], env=self.env(), stdout=logf,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        logf.close()
        CLEANUP.add_proc(self.proc)
        self.modes.append((time.time(), self.late_commit))
        self.starts += 1

    def kill9(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def ready(self) -> bool:
        try:
            conn = http.client.HTTPConnection(HOST, self.port, timeout=3)
            conn.request("GET", "/readyz")
            status = conn.getresponse().status
            conn.close()
            return status == 200
        except (OSError, http.client.HTTPException):
            return False

    def wait_ready(self, timeout=60.0):
        end = time.time() + timeout
        while time.time() < end:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; "
                                   f"log:\n{tail(self.log_path)}")
            if self.ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout}s; log:\n{tail(self.log_path)}")




def build_binary() -> str:
    """cargo build, then the executable cargo reports: wherever the target
    directory is (CARGO_TARGET_DIR, a config file, the default target/)."""
    log("cargo build --bin holdfast")
    r = subprocess.run(["cargo", "build", "--bin", "holdfast", "--message-format=json"],
                       cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError("cargo build failed")
    for line in r.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") \
                and msg.get("target", {}).get("name") == "holdfast":
            return msg["executable"]
    raise RuntimeError("cargo build did not report the holdfast executable")


class Cluster:
    """One backend's instances and database, and the faults done to them.
    Faults that did not go as planned are kept in `problems`."""

    def __init__(self, backend, binary, workdir, late_commit, replicated=False):
        self.backend = backend
        # PostgreSQL as a primary and a synchronous standby of this run's own,
        # and the failover as the fault (instead of the machine's PostgreSQL
        # and its restart).
        self.replicas = Replicas() if replicated else None
        self.pg_port = PG_PORT
        self.failovers: list[dict] = []
        self.binary = binary
        self.workdir = workdir
        self.late_commit = late_commit       # mixed, refund or accept-if-free
        self.instances: list[Instance] = []
        self.by_port: dict[int, Instance] = {}
        self.problems: list[str] = []
        self.kills = 0
        self.instance_restarts = 0
        self.db_restarts = 0
        self.windows: list[tuple[float, float]] = []       # database restart windows
        self.outages: list[tuple[float, float]] = []       # database certainly down
        self.kill_windows: list[tuple[float, float]] = []
        self.crashes: list[str] = []                        # instances that exited by themselves
        self.db_name = None
        self.db_url = None
        self.sqlite_path = None

    # ---- setup and teardown
    def setup(self):
        if self.replicas:
            self.replicas.setup()
            self.pg_port = self.replicas.primary_port
            self.db_name = f"holdfast_failover_{os.getpid()}"
            psql(f'CREATE DATABASE "{self.db_name}"', port=self.pg_port)
            self.db_url = self.replicas.url(self.db_name)
            n = 3
        elif self.backend == "postgres":
            CLEANUP.pg_touched = True
            if not pg_ready():
                raise RuntimeError("PostgreSQL is not accepting connections on "
                                   f"{PG_HOST}:{PG_PORT}")
            self.db_name = f"holdfast_chaos_{os.getpid()}_{uuid.uuid4().hex[:6]}"
            CLEANUP.pg_databases.append(self.db_name)
            psql(f'CREATE DATABASE "{self.db_name}"')
            self.db_url = f"postgres://{PG_USER}@{PG_HOST}:{PG_PORT}/{self.db_name}"
            n = 3
        else:
            self.sqlite_path = os.path.join(self.workdir, "holdfast-chaos.db")
            self.db_url = f"sqlite://{self.sqlite_path}"
            n = 1
        for i in range(n):
            self.instances.append(Instance(f"{self.backend}-{i + 1}", self.binary, self.db_url,
                                           self.workdir, self.late_commit_mode(i)))
        for inst in self.instances:  # all at once: migrations must be safe concurrently
            inst.start()
        for inst in self.instances:
            inst.wait_ready()
        self.by_port = {i.port: i for i in self.instances}
        log(f"{self.backend}: {n} instance(s) ready on ports "
            f"{', '.join(str(i.port) for i in self.instances)} ({self.db_url}); "
            f"late commits: " + ", ".join(f"{i.name} {i.late_commit}" for i in self.instances)
            + (" (accept-if-free after its restart)" if self.flip_on_restart else ""))

    def late_commit_mode(self, i):
        """HOLDFAST_LATE_COMMIT of the i-th instance at its first start."""
        if self.late_commit != "mixed":
            return self.late_commit
        # PostgreSQL: the third instance accepts late payments when the asset
        # is free, the others refund; SQLite: refund until the kill.
        return "accept-if-free" if self.backend == "postgres" and i == 2 else "refund"

    @property
    def flip_on_restart(self):
        return self.backend == "sqlite" and self.late_commit == "mixed"

    @property
    def ports(self):
        return [i.port for i in self.instances]

    def mode_at(self, port, t):
        return self.by_port[port].mode_at(t)

    def op_modes(self, op):
        """The late-commit modes of the instances any attempt of op may have
        reached (each attempt judged at its start and at its end)."""
        return {self.mode_at(a.port, t) for a in op.attempts for t in (a.t0, a.t1)}

    def ensure_up(self):
        """Every instance answering again; one that exited by itself is noted
        and started again."""
        for inst in self.instances:
            if inst.proc.poll() is not None:
                self.crashes.append(f"{inst.name} exited by itself with {inst.proc.returncode}; "
                                    f"log tail:\n{tail(inst.log_path)}")
                inst.start()
                self.instance_restarts += 1
            inst.wait_ready()

    def stop(self):
        for inst in self.instances:
            inst.kill9()

    def drop_database(self):
        if self.replicas:
            self.replicas.remove()
            return
        if self.db_name and self.db_name in CLEANUP.pg_databases:
            try:
                if not pg_ready():
                    pg_ctl("start")
                    for _ in range(60):
                        if pg_ready():
                            break
                        time.sleep(0.5)
                psql(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)', timeout=30)
                CLEANUP.pg_databases.remove(self.db_name)
                log(f"dropped database {self.db_name}")
            except Exception as e:  # noqa: BLE001
                log(f"could not drop database {self.db_name} now ({e}); retrying at exit")

    # ---- faults
    def kill_and_restart(self, inst: Instance, down: float):
        t0 = time.time()
        log(f"kill -9 {inst.name} (pid {inst.proc.pid})")
        inst.kill9()
        self.kills += 1
        time.sleep(down)
        if self.flip_on_restart:
            inst.late_commit = "accept-if-free"
        log(f"starting {inst.name} again (HOLDFAST_LATE_COMMIT={inst.late_commit})")
        inst.start()
        inst.wait_ready()
        self.instance_restarts += 1
        self.kill_windows.append((t0, time.time()))
        log(f"{inst.name} ready again after {time.time() - t0:.1f}s")

    def restart_database(self, down: float):
        """Restarts PostgreSQL: stop (fast: sessions are cut), stay down for
        `down` seconds, start. With 0, one `pg_ctlcluster restart`."""
        t0 = time.time()
        if down <= 0:
            log("restarting PostgreSQL (pg_ctlcluster restart)")
            r = pg_ctl("restart")
            if r.returncode != 0:
                self.problems.append(f"pg_ctlcluster restart failed ({r.returncode}): "
                                     f"{r.stderr.strip()}")
                pg_ctl("start")
        else:
            log(f"restarting PostgreSQL: stop, {down:g}s down, start")
            r = pg_ctl("stop")
            stopped = time.time()
            if r.returncode != 0:
                self.problems.append(f"pg_ctlcluster stop failed ({r.returncode}): "
                                     f"{r.stderr.strip()}")
            time.sleep(down)
            if r.returncode == 0 and not pg_ready():
                # From the end of the stop to the start command, nothing can
                # reach the database.
                self.outages.append((stopped, time.time()))
            r = pg_ctl("start")
            if r.returncode != 0:
                self.problems.append(f"pg_ctlcluster start failed ({r.returncode}): "
                                     f"{r.stderr.strip()}")
        self.db_restarts += 1
        end = time.time() + 90
        pending = list(self.instances)
        while pending and time.time() < end:
            pending = [i for i in pending if not i.ready()]
            if pending:
                time.sleep(0.1)
        t1 = time.time()
        self.windows.append((t0, t1))
        if pending:
            self.problems.append("instances not ready 90 s after the database restart: "
                                 + ", ".join(i.name for i in pending))
        log(f"PostgreSQL restarted; all instances ready again after {t1 - t0:.2f}s")

    def fail_over(self, promote_after: float, serve_within: float):
        """The primary stops at once (`immediate`: no shutdown checkpoint, its
        sessions cut), nothing is primary for `promote_after` seconds, then
        the standby is promoted; every instance must serve again within
        `serve_within` seconds of the promotion, through the same URL."""
        t0 = time.time()
        log("failover: stopping the primary (immediate)")
        self.replicas.kill_primary()
        stopped = time.time()
        time.sleep(promote_after)
        # From the primary's end to the promotion, no server accepts writes.
        self.outages.append((stopped, time.time()))
        log("failover: promoting the standby")
        self.replicas.promote()
        promoted = time.time()
        self.pg_port = self.replicas.standby_port
        end = promoted + 90
        pending = list(self.instances)
        while pending and time.time() < end:
            pending = [i for i in pending if not i.ready()]
            if pending:
                time.sleep(0.1)
        t1 = time.time()
        self.db_restarts += 1
        self.windows.append((t0, t1))
        self.failovers.append({"down": round(promoted - stopped, 2),
                               "serving_after_promotion": round(t1 - promoted, 2)})
        if pending:
            self.problems.append("instances not ready 90 s after the promotion: "
                                 + ", ".join(i.name for i in pending))
        elif t1 - promoted > serve_within:
            self.problems.append(f"instances served again {t1 - promoted:.1f}s after the "
                                 f"promotion (allowed: {serve_within:g}s)")
        log(f"failover: every instance ready {t1 - promoted:.2f}s after the promotion")

    # ---- reading the database directly
    def select(self, table, cols, ts=(), where=""):
        """Rows of a table as dicts; the columns named in ts as epoch seconds."""
        if self.backend == "postgres":
            sel = ", ".join(f"extract(epoch from {c})" if c in ts else c for c in cols)
            rows = psql(f"SELECT {sel} FROM {table} {where}", db=self.db_name, timeout=120,
                        port=self.pg_port)
            return [{c: None if v == "" else (float(v) if c in ts else v)
                     for c, v in zip(cols, row)} for row in rows]
        conn = sqlite3.connect(f"file:{self.sqlite_path}?mode=ro", uri=True, timeout=30)
        try:
            rows = conn.execute(f"SELECT {', '.join(cols)} FROM {table} {where}").fetchall()
        finally:
            conn.close()
        return [{c: parse_ts(v) if c in ts else v for c, v in zip(cols, row)} for row in rows]

    def audit(self):
        """`holdfast audit --json`: (exit status, the report or None, stderr),
        or (None, None, why) when it could not run."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOLDFAST_")}
        env["HOLDFAST_DATABASE_URL"] = self.db_url
        env["RUST_LOG"] = "warn"
        try:
            r = subprocess.run([self.binary, "audit", "--json"], env=env, capture_output=True,
                               text=True, timeout=180)
        except subprocess.TimeoutExpired:
            return None, None, "holdfast audit --json did not finish within 180 s"
        try:
            report = json.loads(r.stdout)
        except ValueError:
            report = None
        if not isinstance(report, dict):
            report = None
        return r.returncode, report, r.stderr.strip()

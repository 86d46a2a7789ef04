"""The run: for each backend, the cluster, the load with its faults, every
request settled, the evidence gathered, every check run; then the summary
and the exit status."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

from . import __doc__ as DOC
from .checks import run_checks
from .client import Http, Recorder, perform
from .cluster import CLEANUP, Cluster, build_binary
from .common import LATE_MODES, RESOLVE_ATTEMPTS, log
from .evidence import Evidence
from .report import figures, print_audit, print_summary
from .workload import AssetPool, Context, client, create_asset


class Phase:
    """One backend's run."""

    def __init__(self, name, args, binary, workdir):
        # "failover": PostgreSQL as a primary and a synchronous standby, and
        # the primary's death and the standby's promotion as the fault.
        self.name = name
        self.failover = name == "failover"
        backend = "postgres" if self.failover else name
        self.backend = backend
        self.args = args
        self.workdir = workdir
        self.cluster = Cluster(backend, binary, workdir, args.late_commit,
                               replicated=self.failover)
        self.rec = Recorder()
        self.threads = args.pg_threads if backend == "postgres" else args.sqlite_threads
        self.problems: list[str] = []     # the harness's own, reported as a check
        self.results = []
        self.reported = 0                 # problems the checks saw
        self.figures = {}
        self.load_seconds = 0.0

    def run(self):
        cluster = self.cluster
        cluster.setup()
        rng = random.Random(self.args.seed)
        pool = AssetPool()
        seed_ctx = Context(self.rec, cluster.ports, pool, time.time() + 3600, self.args.seed)
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda _: create_asset(seed_ctx, Http(), random.Random(), "seed"),
                        range(self.args.assets)))
        log(f"seeded {len(pool)} assets")

        load_start = time.time()
        deadline = load_start + self.args.seconds
        ctx = Context(self.rec, cluster.ports, pool, deadline, self.args.seed)
        threads = [threading.Thread(target=client, args=(ctx, t), daemon=True,
                                    name=f"client-{t}") for t in range(self.threads)]
        for t in threads:
            t.start()
        log(f"{self.name}: {self.threads} client threads for {self.args.seconds}s")

        # The faults, at fractions of the load.
        if self.failover:
            plan = [(0.45, "failover")]
        elif self.backend == "postgres":
            plan = [(0.30, "kill"), (0.60, "db-restart")]
        else:
            plan = [(0.40, "kill")]
        last_report = time.time()
        for frac, action in plan + [(1.0, None)]:
            at = load_start + frac * self.args.seconds
            while time.time() < at:
                time.sleep(min(0.2, max(0.0, at - time.time())))
                if time.time() - last_report > 15:
                    self.progress(pool)
                    last_report = time.time()
            if action == "kill":
                victim = cluster.instances[rng.randrange(len(cluster.instances))]
                cluster.kill_and_restart(victim, self.args.down_seconds)
            elif action == "db-restart":
                cluster.restart_database(self.args.db_down_seconds)
            elif action == "failover":
                cluster.fail_over(self.args.promote_after, self.args.serve_within)
        log("load over; waiting for clients to finish their current request")
        join_end = time.time() + 90
        for t in threads:
            t.join(timeout=max(0.0, join_end - time.time()))
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            self.problems.append(f"client threads still running 90 s after the deadline: {stuck}")
        self.load_seconds = time.time() - load_start

        cluster.ensure_up()
        unanswered = self.resolve()
        self.write_record()
        ev = Evidence(cluster, self.rec, ctx, pool, self.args.seed, self.problems)
        ev.unanswered_after_load = unanswered
        print(f"\n== checks ({self.name})")
        ev.gather()
        print_audit(ev)
        log("checking")
        self.reported = len(self.problems)
        self.results = run_checks(ev)
        self.figures = figures(ev, self.load_seconds)

    def progress(self, pool):
        with self.rec.lock:
            n = self.rec.n_attempts
            top = ", ".join(f"{k}={v}" for k, v in self.rec.status_counts.most_common(6))
        log(f"{self.name}: {n} requests so far ({top}); {len(pool)} assets for sale")

    def resolve(self):
        """Requests that never got an answer (retries exhausted) are retried now,
        with the same key and body, until they get one: only then is the
        client's record complete enough to compare with the database."""
        pending = [op for op in self.rec.ops if op.final is None and op.attempts]
        if pending:
            log(f"{len(pending)} requests without an answer after their retries; retrying them")
            http_ = Http()
            stop_at = time.time() + 60
            for op in pending:
                perform(self.rec, http_, op, self.cluster.ports, phase="resolve",
                        max_attempts=RESOLVE_ATTEMPTS, impatient=False, stop_at=stop_at)
        return len(pending)

    def write_record(self):
        """Every client request, one JSON line per attempt, in the work dir."""
        path = os.path.join(self.workdir, "requests.jsonl")
        with open(path, "w") as out:
            for op in self.rec.ops:
                final = op.final.label() if op.final else None
                for a in op.attempts:
                    out.write(json.dumps({
                        "op": op.id, "kind": op.kind, "method": op.method, "path": op.path,
                        "idempotency_key": op.key, "body": op.payload, "intent":
                        op.meta.get("intent"), "phase": a.phase, "port": a.port,
                        "t0": round(a.t0, 4), "t1": round(a.t1, 4), "timeout": a.timeout,
                        "status": a.status, "error_code": a.code, "error": a.error,
                        "replayed": a.replayed, "final": final,
                        "response": a.raw.decode(errors="replace")[:2000],
                    }) + "\n")

    def violations(self):
        return sum(len(r.violations) for r in self.results) + len(self.problems_unreported())

    def problems_unreported(self):
        """Harness problems the checks did not see (the run failed before or
        after them)."""
        return self.problems[self.reported:]

    def summary(self):
        print_summary(self.name, self.cluster, self.threads,
                      dict(self.figures, load_seconds=self.load_seconds), self.results)
        for text in self.problems_unreported():
            print(f"  HARNESS {text}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="chaos.py", description=DOC.split("\n\n")[0])
    p.add_argument("--backend", choices=["postgres", "sqlite", "both", "failover"],
                   default="both",
                   help="failover: PostgreSQL as a primary with a synchronous standby, the "
                        "primary stopped (immediate) mid-run and the standby promoted")
    p.add_argument("--promote-after", type=float, default=3.0,
                   help="failover: seconds without a primary before the standby is promoted")
    p.add_argument("--serve-within", type=float, default=10.0,
                   help="failover: seconds after the promotion within which every instance "
                        "must serve again")
    p.add_argument("--seconds", type=float, default=90.0, help="seconds of load per backend")
    p.add_argument("--bin", help="holdfast binary (default: cargo build, and the executable "
                                 "it reports)")
    p.add_argument("--assets", type=int, default=200, help="assets seeded")
    p.add_argument("--pg-threads", type=int, default=24)
    p.add_argument("--sqlite-threads", type=int, default=12)
    p.add_argument("--down-seconds", type=float, default=3.0,
                   help="how long a killed instance stays down")
    p.add_argument("--db-down-seconds", type=float, default=2.0,
                   help="how long PostgreSQL stays stopped in its restart (0: a plain "
                        "pg_ctlcluster restart)")
    p.add_argument("--late-commit", choices=["mixed", *LATE_MODES], default="mixed",
                   help="HOLDFAST_LATE_COMMIT of the instances; mixed: PostgreSQL's third "
                        "instance accept-if-free, SQLite's instance accept-if-free after its "
                        "restart, the others refund")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--time-limit", type=float, default=None,
                   help="hard bound on the whole run in seconds (default: per backend "
                        "seconds + 240)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    backends = ["postgres", "sqlite"] if args.backend == "both" else [args.backend]

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)

    binary = os.path.abspath(args.bin) if args.bin else build_binary()
    if not os.access(binary, os.X_OK):
        print(f"chaos: {binary} is not an executable", file=sys.stderr)
        return 2

    limit = args.time_limit or len(backends) * (args.seconds + 240)

    def watchdog():
        log(f"time limit of {limit:.0f}s reached: killing everything")
        CLEANUP.run()
        os._exit(3)

    timer = threading.Timer(limit, watchdog)
    timer.daemon = True
    timer.start()

    workdir = tempfile.mkdtemp(prefix="holdfast-chaos-")
    log(f"seed {args.seed}, binary {binary}, work dir {workdir}, time limit {limit:.0f}s")
    phases = []
    try:
        for backend in backends:
            d = os.path.join(workdir, backend)
            os.makedirs(d)
            phase = Phase(backend, args, binary, d)
            phases.append(phase)
            try:
                phase.run()
            except SystemExit:
                raise
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                where = traceback.extract_tb(e.__traceback__)[-1]
                phase.problems.append(f"{type(e).__name__}: {e} ({os.path.basename(where.filename)} "
                                      f"line {where.lineno}, in {where.name})")
            finally:
                phase.cluster.stop()
                phase.cluster.drop_database()
            phase.summary()
    finally:
        timer.cancel()
        CLEANUP.run()
    total = sum(ph.violations() for ph in phases)
    print("\n== chaos: " + "; ".join(f"{ph.name} violations={ph.violations()}"
                                     for ph in phases) + f"; total violations={total}")
    if total == 0 and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"logs kept in {workdir}")
    return 1 if total else 0

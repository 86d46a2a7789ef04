"""What a backend's run did, in figures, and what its checks found."""

from __future__ import annotations

import collections

from .checks import late_sales, refused_late_by_accepting, released_by_withdrawal, \
    certain_intervals
from .client import HTTP_TIMEOUT
from .common import EXPIRY_MARGIN as M


def figures(ev, load_seconds):
    ops, attempts, cluster = ev.ops, ev.attempts, ev.cluster

    def within(t, windows):
        return any(w0 <= t <= w1 for w0, w1 in windows)

    by_status = collections.Counter(a.label() for a in attempts)
    final_by_kind = collections.defaultdict(collections.Counter)
    attempts_by_kind = collections.Counter()
    for op in ops:
        final_by_kind[op.kind][op.final.label() if op.final else "unanswered"] += 1
        attempts_by_kind[op.kind] += len(op.attempts)
    lat = sorted(a.t1 - a.t0 for a in attempts if a.status is not None)

    def pct(q):
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else 0

    outage_answers = collections.Counter(
        a.label() for a in attempts
        if any(o0 <= a.t0 and a.t1 <= o1 for o0, o1 in cluster.outages))
    late_accepted = {op.meta["rid"] for op in ev.ops_of("commit")
                     if any(a.good and a.status == 200 for a in op.attempts)
                     and op.attempts[0].t0 > ev.expiry(op) + M
                     and "accept-if-free" in cluster.op_modes(op)}
    db_released = {rid for rid, r in ev.res_db.items() if r["status"] == "RELEASED"}
    intervals = certain_intervals(ev)
    commit_ops = ev.ops_of("commit")
    reused = [op for op in commit_ops if op.meta["intent"].startswith("reuse-")]
    fanout = [op for op in commit_ops if op.meta["intent"] == "fanout"]
    fanout_groups = collections.defaultdict(list)
    for op in fanout:
        fanout_groups[op.meta["pref"]].append(op)
    spread = collections.Counter(len({o.meta["rid"] for o in ops_})
                                 for ops_ in ev.commits_by_pref.values())
    fates = collections.Counter("REFUNDED" if p["refund_id"] else "BOUGHT"
                                for p in ev.db["payments"])
    return {
        "load_seconds": load_seconds,
        "requests": len(attempts),
        "ops": len(ops),
        "verify_gets": ev.reader.rec.n_attempts,
        "listings": len(ev.listings),
        "timelines": len(ev.timelines),
        "timeline_pages": sum(t[3] for t in ev.timelines),
        "by_status": by_status,
        "final_by_kind": final_by_kind,
        "attempts_by_kind": attempts_by_kind,
        "intents": ev.intents,
        "replays": sum(1 for a in attempts if a.replayed),
        "retry_replays": sum(1 for a in attempts if a.replayed and a.phase != "dup"),
        "retries": sum(1 for op in ops for a in op.attempts[1:] if a.phase != "dup"),
        "duplicates": sum(1 for a in attempts if a.phase == "dup"),
        "conn_errors": sum(1 for a in attempts if a.status is None),
        "impatient": sum(1 for a in attempts if a.timeout < HTTP_TIMEOUT),
        "impatient_lost": sum(1 for a in attempts if a.timeout < HTTP_TIMEOUT
                              and a.status is None),
        "latency": (pct(0.5), pct(0.99), lat[-1] * 1000 if lat else 0),
        "503": by_status.get("503 SERVICE_UNAVAILABLE", 0),
        "503_window": sum(1 for a in attempts if a.status == 503 and within(a.t1, cluster.windows)),
        "conn_window": sum(1 for a in attempts if a.status is None
                           and within(a.t1, cluster.windows)),
        "2xx_window": sum(1 for a in attempts if a.status is not None and 200 <= a.status < 300
                          and within(a.t1, cluster.windows)),
        "windows": [round(w1 - w0, 2) for w0, w1 in cluster.windows],
        "outages": [round(o1 - o0, 2) for o0, o1 in cluster.outages],
        "outage_answers": outage_answers,
        "kill_windows": [round(w1 - w0, 2) for w0, w1 in cluster.kill_windows],
        "unanswered_after_load": ev.unanswered_after_load,
        "late_refunded": sum(1 for op in commit_ops for a in op.attempts
                             if a.good and a.code == "HOLD_EXPIRED" and a is op.final),
        "late_refused_free": sum(1 for _ in refused_late_by_accepting(ev)),
        "late_accepted": len(late_accepted),
        "late_sold": len(late_sales(ev)),
        "holds_refused": collections.Counter(
            f"{op.final.code} {(op.final.body or {}).get('asset_status', '')}".strip()
            for op in ev.ops_of("hold") if op.final is not None
            and op.final.status == 409 and isinstance(op.final.body, dict)),
        "refunds_answered": len(ev.refunds_told),
        "refunds_db": len(ev.db["refunds"]),
        "reservations_db": len(ev.res_db),
        "handed": len(ev.handed),
        "skipped_or_cleared": sum(1 for e in ev.db["queue_events"] if e["type"] != "reservation.held"),
        "hold_keys_ok": len(ev.hold_keys_ok),
        "committed": len(ev.committed),
        "released": len(ev.released),
        "forced_releases": sum(1 for rid in db_released - set(ev.released)
                               if released_by_withdrawal(ev, ev.res_db[rid])),
        "voided": len(ev.voided),
        "voided_refund": sum(1 for op in ev.voided.values() if op.meta["refund"]),
        "extended": sum(len(x) for x in ev.extended.values()),
        "extended_res": len(ev.extended),
        "withdrawn_intervals": sum(len(w) for w, _ in intervals.values()),
        "gated_intervals": sum(len(g) for _, g in intervals.values()),
        "assets_created": ev.assets_created,
        "refs": len(ev.commits_by_pref),
        "refs_spread": spread,
        "reused": len(reused),
        "reused_final": collections.Counter(op.final.label() if op.final else "unanswered"
                                            for op in reused),
        "fanouts": len(fanout_groups),
        "fanout_commits": len(fanout),
        "fanout_final": collections.Counter(op.final.label() if op.final else "unanswered"
                                            for op in fanout),
        "payment_used": sum(1 for op in commit_ops
                            if op.final and op.final.code == "PAYMENT_REFERENCE_USED"),
        "lookups": collections.Counter(op.final.label() if op.final else "unanswered"
                                       for op in ev.ops_of("payment")),
        "payment_gets": collections.Counter(a.label() for a in ev.payment_gets.values()),
        "fates": fates,
    }


def counts(c):
    return ", ".join(f"{k}={n}" for k, n in sorted(c.items(), key=lambda kv: str(kv[0])))


def print_audit(ev):
    rc, report, err = ev.audit
    if rc is None:
        print(f"  audit: {err}")
        return
    print(f"  audit: exit {rc}")
    if report is None:
        print("    (stdout is not JSON)")
    else:
        for c in report.get("checks", []):
            n = c.get("violations")
            mark = "ok  " if not n else ("note" if c.get("history") else "FAIL")
            print(f"    {mark} {c.get('name')}: {n} — {c.get('description', '')}")
            for ex in (c.get("examples") or [])[:5]:
                print(f"           e.g. {str(ex)[:300]}")
    if err:
        print("    stderr: " + err[:1000])


def print_checks(results):
    width = max(len(r.check.name) for r in results)
    for c, found, seconds in results:
        print(f"    {'ok  ' if not found else 'FAIL'} {c.name:<{width}} {len(found):>5}"
              f"   ({seconds:.2f}s)")
        for text in found[:8]:
            print(f"           {text}")
        if len(found) > 8:
            print(f"           … and {len(found) - 8} more")


def print_summary(backend, cluster, threads, f, results):
    print(f"\n== summary ({backend})")
    print(f"  instances {len(cluster.instances)} (late commits: "
          + ", ".join(f"{i.name} " + "→".join(m for n, (_, m) in enumerate(i.modes)
                                             if n == 0 or i.modes[n - 1][1] != m)
                      for i in cluster.instances)
          + f"), client threads {threads}, load {f.get('load_seconds', 0):.1f}s")
    if "requests" not in f:
        print("  (no figures: the run did not reach its checks)")
    else:
        print(f"  requests {f['requests']} ({f['ops']} logical requests; {f['verify_gets']} GETs "
              f"to verify, {f['listings']} listings, {f['timelines']} timelines in "
              f"{f['timeline_pages']} pages)")
        print("  by status: " + counts(f["by_status"]))
        print("  per operation, logical requests by final answer [attempts]:")
        for kind in sorted(f["final_by_kind"]):
            c = f["final_by_kind"][kind]
            print(f"    {kind:<12} {sum(c.values()):>6} [{f['attempts_by_kind'][kind]:>6}]: "
                  + counts(c))
        print("  flows: " + counts(f["intents"]))
        print(f"  replays {f['replays']} ({f['retry_replays']} answering blind retries, the "
              f"rest deliberate duplicates); blind retries {f['retries']}, deliberate "
              f"duplicates {f['duplicates']}, connection errors {f['conn_errors']}")
        print(f"  impatient attempts {f['impatient']} (answer lost: {f['impatient_lost']}); "
              f"latency ms p50 {f['latency'][0]:.0f}, p99 {f['latency'][1]:.0f}, "
              f"max {f['latency'][2]:.0f}")
        print(f"  kills {cluster.kills}, instance restarts {cluster.instance_restarts} "
              f"(down+ready s: {f['kill_windows']}), database restarts {cluster.db_restarts} "
              f"(window s: {f['windows']})")
        print(f"  503 total {f['503']}, 503 in window {f['503_window']} (outside it "
              f"{f['503'] - f['503_window']}), connection errors in window "
              f"{f['conn_window']}, 2xx in window {f['2xx_window']}")
        for n, failover in enumerate(cluster.failovers, 1):
            print(f"  failover {n}: no primary for {failover['down']} s, every instance "
                  f"serving {failover['serving_after_promotion']} s after the promotion")
        if cluster.outages:
            print(f"  database fully down for {f['outages']} s; requests sent and answered "
                  f"then: " + (counts(f["outage_answers"]) or "none"))
        print(f"  unanswered after retries {f['unanswered_after_load']} "
              f"(retried to an answer at the end)")
        print(f"  reservations in db {f['reservations_db']}, hold keys acknowledged "
              f"{f['hold_keys_ok']}; committed {f['committed']} (voided {f['voided']}, "
              f"{f['voided_refund']} with refund), released {f['released']} "
              f"(+{f['forced_releases']} by forced withdrawals), assets created "
              f"{f['assets_created']}")
        print(f"  waiting lists: {f['handed']} holds handed to waiters, "
              f"{f['skipped_or_cleared']} queues cleared or waiters passed over")
        print(f"  extensions acknowledged {f['extended']} on {f['extended_res']} holds; "
              f"withdrawals certain for {f['withdrawn_intervals']} intervals, sale openings "
              f"for {f['gated_intervals']}")
        print(f"  late payments: refunded {f['late_refunded']} ({f['late_refused_free']} "
              f"decided by accept-if-free instances only, each explained by a hold since or a "
              f"withdrawal), accepted {f['late_accepted']} (sales after expiry in db: "
              f"{f['late_sold']})")
        print("  holds refused: " + counts(f["holds_refused"]))
        print(f"  payment references {f['refs']} (by how many reservations each was sent to: "
              f"{counts(f['refs_spread'])}); fates in db: {counts(f['fates'])}")
        print(f"  reused references {f['reused']}: {counts(f['reused_final'])}")
        print(f"  one reference to several holds at once: {f['fanouts']} times, "
              f"{f['fanout_commits']} commits: {counts(f['fanout_final'])}")
        print(f"  PAYMENT_REFERENCE_USED answers {f['payment_used']}; lookups during the load: "
              f"{counts(f['lookups'])}; at the end: {counts(f['payment_gets'])}")
        print(f"  refunds answered {f['refunds_answered']}, refunds in db {f['refunds_db']}")
    if results:
        failed = sum(1 for r in results if r.violations)
        print(f"  checks: {len(results)}, failed {failed}")
        print_checks(results)
    total = sum(len(r.violations) for r in results)
    print(f"  violations={total}")

"""The invariants the chaos run checks, one function each, registered in
CHECKS with a name and a description (as src/store/audit.rs does). Each
takes the Evidence and yields one line per violation; none does I/O."""

from __future__ import annotations

import collections
import math
import time
import traceback
from typing import Callable, Iterable, NamedTuple

from .cluster import tail
from .common import EXPIRY_MARGIN as M, HOLD_MAX_TOTAL_SECONDS, TS_EPS, iso, parse_ts, rel
from .contract import BY_INTENT, REFUND_REASONS
from .evidence import Evidence, span


class Check(NamedTuple):
    name: str
    description: str
    fn: Callable[[Evidence], Iterable[str]]


CHECKS: list[Check] = []


def check(name, description):
    def register(fn):
        CHECKS.append(Check(name, description, fn))
        return fn
    return register


class Result(NamedTuple):
    check: Check
    violations: list[str]
    seconds: float


def run_checks(ev: Evidence) -> list[Result]:
    """Every check, in order; one that raises is reported as violated."""
    results = []
    for c in CHECKS:
        t0 = time.time()
        try:
            found = list(c.fn(ev))
        except Exception as e:  # noqa: BLE001
            where = traceback.extract_tb(e.__traceback__)[-1]
            found = [f"the check raised {type(e).__name__}: {e} (line {where.lineno}, "
                     f"in {where.name})"]
        results.append(Result(c, found, time.time() - t0))
    return results


def what(op):
    return f"{op.kind} {op.path} key={op.key} ({op.meta.get('intent')})"


def answered(op):
    """The attempts of op that got a definitive answer."""
    return [a for a in op.attempts if a.status is not None and not a.retryable]


def body_of(a):
    return a.body if isinstance(a.body, dict) else {}


# --------------------------------------------------------------------------
# The run itself
# --------------------------------------------------------------------------


@check("faults_go_as_planned",
       "The planned faults (kill -9, PostgreSQL restart) ran, and the client threads ended "
       "within their bounds.")
def faults_go_as_planned(ev):
    yield from ev.cluster.problems
    yield from ev.problems


@check("instances_stay_up",
       "No instance exits by itself or panics (only the planned kill stops one).")
def instances_stay_up(ev):
    yield from ev.cluster.crashes
    for inst in ev.cluster.instances:
        if "panicked" in tail(inst.log_path, 100000):
            yield f"{inst.name} log has a panic: see {inst.log_path}"


@check("every_request_answered",
       "Every request gets a definitive answer, retried with its key after the load if need be.")
def every_request_answered(ev):
    for op in ev.ops:
        if op.final is None and op.attempts:
            last = op.attempts[-1]
            yield (f"{what(op)}: no answer after {len(op.attempts)} attempts (last: "
                   f"{last.label()} {last.error or ''})")


@check("audit_is_clean",
       "holdfast audit --json exits 0 with ok: true, and a database this run created has no "
       "history from before a rule.")
def audit_is_clean(ev):
    rc, report, err = ev.audit
    if rc is None:
        yield err
        return
    if rc == 2 and ("unrecognized subcommand" in err or "unexpected argument" in err):
        yield "this holdfast binary has no `audit --json`: " + err.splitlines()[0]
        return
    if report is None:
        yield f"holdfast audit --json exit {rc}, stdout is not a JSON object; stderr: {err[:300]}"
        return
    failing = []
    for c in report.get("checks", []):
        if c.get("violations"):
            kind = "history" if c.get("history") else "violation"
            failing.append(c.get("name"))
            yield (f"{c.get('name')}: {c.get('violations')} {kind} row(s), e.g. "
                   f"{(c.get('examples') or [])[:3]}")
    ok = report.get("ok") is True
    if ok != (rc == 0) or (not ok and not failing):
        yield f"holdfast audit --json exit {rc} with ok={report.get('ok')!r}"


# --------------------------------------------------------------------------
# Every answer against the document and the flows' own claims
# --------------------------------------------------------------------------


def all_attempts(ev):
    """The load's attempts and the checks' own reads."""
    yield from ev.attempts
    for op in ev.reader.ops:
        yield from op.attempts


@check("no_server_errors",
       "No answer is a 5xx other than 503 SERVICE_UNAVAILABLE, during the load or after it.")
def no_server_errors(ev):
    for a in all_attempts(ev):
        if a.status is not None and a.status >= 500 and a.status != 503:
            yield (f"{a.status} {a.code} for {a.op.method} {a.op.path} key={a.op.key} at "
                   f"{rel(a.t0)}: {a.raw[:300]!r}")


@check("answers_are_documented",
       "Every answer's status and error_code is one openapi/holdfast.json lists for its "
       "operation (503 and 429 included; a 5xx other than 503 is reported above).")
def answers_are_documented(ev):
    for a in all_attempts(ev):
        if a.status is None or (a.status >= 500 and a.status != 503):
            continue
        op = ev.document.operation(a.op.method, a.op.path)
        if op is None:
            yield f"{a.op.method} {a.op.path}: no operation of the document matches"
        elif not op.documents(a.status, a.code if a.status >= 400 else None):
            yield (f"{a.label()} for {op.id} ({a.op.method} {a.op.path}, "
                   f"{a.op.meta.get('intent')}): not in the document: {a.raw[:200]!r}")



def offer_came_too_late(op, a):
    """An offer whose `expires_at` was less than HOLDFAST_HOLD_SECONDS_MIN
    (1 s) ahead by the time the service answered (a retry through a failover
    can arrive seconds after the offer was written): its 422 is earned."""
    if op.kind != "offer" or a.code != "VALIDATION_FAILED":
        return False
    until = parse_ts(op.payload.get("expires_at"))
    return until is not None and a.t1 is not None and a.t1 + 1.0 + TS_EPS > until


@check("answers_are_earned",
       "Every definitive answer to the load is one its well-formed, open-mode requests can "
       "earn: the document's, less those contract.UNEARNED rules out.")
def answers_are_earned(ev):
    earnable = {}
    for op in ev.ops:
        doc_op = ev.document.operation(op.method, op.path)
        if doc_op is None:
            continue  # reported above
        if doc_op.id not in earnable:
            earnable[doc_op.id] = doc_op.earnable()
        for a in answered(op):
            if offer_came_too_late(op, a):
                continue
            if doc_op.documents(a.status, a.code if a.status >= 400 else None) and \
                    (a.status, a.code) not in earnable[doc_op.id]:
                yield f"{a.label()} for {what(op)} body={op.payload}: {a.raw[:300]!r}"


def sent_elsewhere(ev, op):
    """The reservations other than op's that a commit carried op's reference to."""
    return {o.meta["rid"] for o in ev.commits_by_pref[op.meta["pref"]]} - {op.meta["rid"]}


@check("flows_get_their_answer",
       "Flows whose answer is known in advance (contract.BY_INTENT) get it; a commit whose "
       "reference was also sent for another reservation may instead be told "
       "PAYMENT_REFERENCE_USED (judged by the payment checks).")
def flows_get_their_answer(ev):
    for op in ev.ops:
        want = BY_INTENT.get(op.meta.get("intent"))
        if not want:
            continue
        for a in answered(op):
            if (a.status, a.code) in want:
                continue
            if op.kind == "commit" and a.code == "PAYMENT_REFERENCE_USED" and \
                    sent_elsewhere(ev, op):
                continue
            yield f"{a.label()} for {what(op)}, expected {sorted(want, key=str)}"


@check("effective_status_shown",
       "A reservation an answer shows is HELD only before its expiry and EXPIRED only after "
       "it (by the service's clock, read within the request).")
def effective_status_shown(ev):
    for a in all_attempts(ev):
        if a.replayed or not isinstance(a.body, dict) or a.status is None or a.status >= 500:
            continue
        b = a.body
        shown = b.get("items") if isinstance(b.get("items"), list) else \
            [b.get("reservation") if isinstance(b.get("reservation"), dict) else b]
        for r in shown:
            if not isinstance(r, dict) or "reservation_id" not in r:
                continue
            e = parse_ts(r.get("expires_at"))
            if e is None:
                continue
            if r.get("status") == "HELD" and e < a.t0 - M:
                yield (f"{a.op.method} {a.op.path}: {r['reservation_id']} HELD though it "
                       f"expired {a.t0 - e:.2f}s before the request")
            elif r.get("status") == "EXPIRED" and e > a.t1 + M:
                yield (f"{a.op.method} {a.op.path}: {r['reservation_id']} EXPIRED "
                       f"{e - a.t1:.2f}s before its expiry")


@check("nothing_answered_while_db_down",
       "A request sent and answered while PostgreSQL was certainly stopped is answered 503 "
       "(or not at all).")
def nothing_answered_while_db_down(ev):
    for a in ev.attempts:
        if any(o0 <= a.t0 and a.t1 <= o1 for o0, o1 in ev.cluster.outages) and \
                a.status is not None and a.status != 503:
            yield (f"{a.label()} for {a.op.kind} {a.op.path} sent and answered while "
                   f"PostgreSQL was stopped")


# The requests that create something: 201 when they act.
CREATES = ("hold", "offer", "join")


def created_by(ev):
    """reservation id -> the Idempotency-Keys whose hold made it: answered
    201 with it, or replayed that answer."""
    made = collections.defaultdict(set)
    for op in ev.ops:
        for a in op.attempts:
            if op.kind == "hold" and (a.status == 201 or a.status == 200 and a.replayed):
                made[body_of(a).get("reservation_id")].add(op.key)
    return made


def own_hold(op, a, made):
    """Whether a hold's 200 is the buyer's own live hold (a second tab)
    rather than something this hold did: the buyer's, HELD, made before
    the answer, by another request's 201, the queue or an offer."""
    body = body_of(a)
    created = parse_ts(body.get("created_at"))
    rid = body.get("reservation_id")
    by_another = bool(made.get(rid, set()) - {op.key}) or body.get("via") is not None
    return (body.get("buyer_id") == op.meta["buyer_id"] and body.get("status") == "HELD"
            and created is not None and a.t1 is not None and created < a.t1 + TS_EPS
            and by_another)


@check("retries_never_act_twice",
       "Per Idempotency-Key, every 2xx and every 409 with a refund is the same answer about "
       "the same reservation; a replay is the original byte for byte; once acknowledged, a "
       "retry answers nothing else; only answers that changed something are replayed; a hold, "
       "an offer and a join are 201 when they act and 200 only as a replay (or, for a hold, "
       "with the buyer's own live hold, made by another request before it answered).")
def retries_never_act_twice(ev):
    made = created_by(ev)
    for op in ev.ops:
        if op.key is None:
            continue
        for a in op.attempts:
            if op.kind not in CREATES or not (a.status == 200 and not a.replayed
                                              or a.status == 201 and a.replayed):
                continue
            if a.status == 200 and op.kind == "hold" and own_hold(op, a, made):
                continue
            yield (f"{op.kind} key={op.key} answered {a.status} with "
                   f"Idempotent-Replayed={a.replayed}")
        goods = [a for a in op.attempts if a.good]
        if not goods:
            continue
        outcomes = set()
        for a in goods:
            body = body_of(a)
            rf = a.refund
            if 200 <= a.status < 300:
                rid = body.get("reservation_id")
                outcomes.add(("2xx", rid, None))
            else:
                rid = (body.get("reservation") or {}).get("reservation_id")
                outcomes.add((a.code, rid, rf.get("refund_id") if rf else None))
            if "rid" in op.meta and rid != op.meta["rid"]:
                yield f"{op.kind} of {op.meta['rid']} answered about reservation {rid}"
        if len(outcomes) > 1:
            yield f"{op.kind} key={op.key} got different answers: {sorted(outcomes, key=str)}"
        if op.kind in CREATES and sum(1 for a in goods if a.status == 201) > 1:
            yield f"hold key={op.key} created more than once (several 201)"
        replays = {a.raw for a in goods if a.replayed}
        originals = {a.raw for a in goods if not a.replayed}
        if len(replays) > 1:
            yield f"{op.kind} key={op.key}: replays differ"
        if replays and originals and not replays <= originals:
            yield (f"{op.kind} key={op.key}: replay is not the original answer: "
                   f"{next(iter(replays))[:200]!r} vs {next(iter(originals))[:200]!r}")
        # Once acknowledged, a request stays acknowledged: a later attempt
        # with its key must not answer anything else (a hold retried after
        # its 201 must replay, not find the asset taken).
        seen_good = False
        for a in sorted(op.attempts, key=lambda x: x.t0):
            if a.good:
                seen_good = True
            elif seen_good and a.status is not None and not a.retryable:
                yield f"{op.kind} key={op.key}: acknowledged, then a retry answered {a.label()}"
        for a in op.attempts:
            if a.replayed and not a.good and a.status is not None:
                yield f"{op.kind} key={op.key}: replayed a {a.label()}"


# --------------------------------------------------------------------------
# Payments: each reference has exactly one fate
# --------------------------------------------------------------------------


def fates_in_db(ev):
    """(scope, pref) -> the fates the money records show: ("BOUGHT", rid,
    None) for each sale (kept, also when voided since), ("REFUNDED", rid,
    refund_id) for each refund except a voided sale's refund of its own
    payment (part of that sale's fate); and -> that own refund's rows."""
    fates = collections.defaultdict(list)
    own = collections.defaultdict(list)
    for r in ev.db["reservations"]:
        if r["status"] in ("COMMITTED", "VOIDED") and r["payment_reference"] is not None:
            fates[(r["payment_client"], r["payment_reference"])].append(("BOUGHT", r["id"], None))
    for rf in ev.db["refunds"]:
        r = ev.res_db.get(rf["reservation_id"]) or {}
        key = (rf["payment_client"], rf["payment_reference"])
        if rf["reason"] == "SALE_VOIDED" and r.get("status") == "VOIDED" and \
                r.get("payment_reference") == rf["payment_reference"] and \
                r.get("payment_client") == rf["payment_client"]:
            own[key].append(rf)
        else:
            fates[key].append(("REFUNDED", rf["reservation_id"], rf["id"]))
    return fates, own


@check("one_fate_in_database",
       "In the database each payment reference bought at most one reservation or has at "
       "most one refund, never both; only a voided sale's own SALE_VOIDED refund (at most "
       "one) goes with its sale.")
def one_fate_in_database(ev):
    fates, own = fates_in_db(ev)
    for (scope, pref), fs in sorted(fates.items(), key=str):
        if len(fs) > 1:
            yield f"{pref} (scope {scope!r}) has {len(fs)} fates: {sorted(fs, key=str)}"
    for (scope, pref), rows in sorted(own.items(), key=str):
        if len(rows) > 1:
            yield (f"{pref} (scope {scope!r}): its voided sale refunded it "
                   f"{len(rows)} times: {[rf['id'] for rf in rows]}")


@check("payments_table_records_fates",
       "The payments table has one row per reference with a fate, naming that sale or that "
       "refund, and no other row; in open mode every payment's scope is '-'.")
def payments_table_records_fates(ev):
    fates, own = fates_in_db(ev)
    for key, fs in sorted(fates.items(), key=str):
        row = ev.fates_db.get(key)
        if row is None:
            yield f"{key[1]} (scope {key[0]!r}): {sorted(fs, key=str)} but no payments row"
            continue
        for _, rid, refund_id in fs:
            if (row["reservation_id"], row["refund_id"]) != (rid, refund_id):
                yield (f"{key[1]}: {'refund ' + refund_id if refund_id else 'the sale'} through "
                       f"{rid} is not its recorded fate ({row['reservation_id']}, refund "
                       f"{row['refund_id']})")
    for key, row in sorted(ev.fates_db.items(), key=str):
        if key not in fates:
            yield (f"payments row {key} ({row['reservation_id']}, refund {row['refund_id']}) "
                   f"with no sale or refund of it")
    scopes = collections.Counter(p["client"] for p in ev.db["payments"])
    scopes.update(r["payment_client"] for r in ev.db["reservations"]
                  if r["payment_reference"] is not None)
    scopes.update(rf["payment_client"] for rf in ev.db["refunds"])
    for scope, n in scopes.items():
        if scope != "-":
            yield f"{n} payment rows with scope {scope!r} (open mode: '-')"


@check("one_fate_in_answers",
       "From the answers alone: each payment reference was told at most one sale (a 200 for "
       "one reservation) or one refund, never both; only a voided sale's own SALE_VOIDED "
       "refund goes with its sale.")
def one_fate_in_answers(ev):
    refunds_by_pref = collections.defaultdict(dict)   # pref -> refund_id -> (rid, reason)
    for (rid, pref), told in ev.refunds_told.items():
        for refund_id, reason in told.items():
            refunds_by_pref[pref][refund_id] = (rid, reason)
    for pref, ops in ev.commits_by_pref.items():
        sold = sorted({op.meta["rid"] for op in ops
                       if any(a.good and a.status == 200 for a in op.attempts)})
        refunds = refunds_by_pref.get(pref, {})
        if len(sold) > 1:
            yield f"{pref}: sales acknowledged for {sold}"
        if len(refunds) > 1:
            yield f"{pref}: refunds answered {sorted(refunds.items())}"
        for refund_id, (rid, reason) in refunds.items():
            if sold and not (reason == "SALE_VOIDED" and rid in sold):
                yield f"{pref}: sold to {sold} and refunded by {refund_id} ({rid}, {reason})"


def payment_member_agrees(ev, pref, payment, at_end):
    """What a `payment` object (a PAYMENT_REFERENCE_USED answer's, or GET
    /v1/payments') says against the recorded fate; None when it agrees.
    A BOUGHT fate's refund is its voided sale's own refund: null before the
    void, so only at the end must it be exactly that."""
    fate = ev.fate(pref)
    if fate is None:
        return f"payment {payment} but the database records no fate of {pref}"
    if not isinstance(payment, dict) or payment.get("payment_reference") != pref:
        return f"payment member {payment!r:.200} is not about {pref}"
    shown = (payment.get("reservation") or {}).get("reservation_id")
    refund = payment.get("refund")
    refund_id = refund.get("refund_id") if isinstance(refund, dict) else None
    want = "REFUNDED" if fate["refund_id"] else "BOUGHT"
    if payment.get("fate") != want or shown != fate["reservation_id"]:
        return (f"{pref}: told {payment.get('fate')} through {shown}, the database records "
                f"{want} through {fate['reservation_id']}")
    if want == "REFUNDED" and refund_id != fate["refund_id"]:
        return f"{pref}: told refund {refund_id}, the database records {fate['refund_id']}"
    if want == "BOUGHT":
        own = ev.own_void_refund(fate["reservation_id"], pref)
        own_id = own["id"] if own else None
        if refund_id != own_id and (refund_id is not None or at_end):
            return (f"{pref}: BOUGHT with refund {refund_id}; its voided sale's own refund "
                    f"is {own_id}")
    return None


@check("payment_reference_used_changes_nothing",
       "A PAYMENT_REFERENCE_USED answer carries no refund, names the reservation addressed, "
       "and its `payment` names another reservation the reference was sent for; that "
       "reservation addressed neither sold with it nor refunded it.")
def payment_reference_used_changes_nothing(ev):
    for op in ev.ops_of("commit"):
        rid, pref = op.meta["rid"], op.meta["pref"]
        for a in answered(op):
            if a.code != "PAYMENT_REFERENCE_USED":
                continue
            body = body_of(a)
            if "refund" in body:
                yield f"{what(op)}: PAYMENT_REFERENCE_USED with a refund: {body['refund']!r:.200}"
            if (body.get("reservation") or {}).get("reservation_id") != rid:
                yield f"{what(op)}: PAYMENT_REFERENCE_USED without the reservation addressed"
            other = ((body.get("payment") or {}).get("reservation") or {}).get("reservation_id")
            if other == rid:
                yield f"{what(op)}: PAYMENT_REFERENCE_USED names this reservation as its fate"
            elif other not in sent_elsewhere(ev, op):
                yield (f"{what(op)}: PAYMENT_REFERENCE_USED through {other}, which no commit "
                       f"carried {pref} to")
            if ev.refunds_db.get((rid, pref)):
                yield f"{what(op)}: PAYMENT_REFERENCE_USED, yet {rid} has a refund of {pref}"
            r = ev.res_db.get(rid) or {}
            if r.get("payment_reference") == pref:
                yield f"{what(op)}: PAYMENT_REFERENCE_USED, yet {rid} is sold with {pref}"


@check("payment_answers_match_fates",
       "Every definitive commit answer agrees with the payment's recorded fate: a 200 with "
       "BOUGHT through that reservation (COMMITTED or VOIDED with that reference), a refund "
       "with REFUNDED by that refund (or the voided sale's own refund), "
       "PAYMENT_REFERENCE_USED with the fate its `payment` names.")
def payment_answers_match_fates(ev):
    for op in ev.ops_of("commit"):
        rid, pref = op.meta["rid"], op.meta["pref"]
        fate = ev.fate(pref)
        bought_here = fate is not None and fate["refund_id"] is None and \
            fate["reservation_id"] == rid
        own = ev.own_void_refund(rid, pref)
        for a in answered(op):
            if a.status == 200:
                r = ev.res_db.get(rid) or {}
                if not bought_here or r.get("status") not in ("COMMITTED", "VOIDED") \
                        or r.get("payment_reference") != pref:
                    yield (f"{what(op)}: 200, but the recorded fate is {fate} and {rid} is "
                           f"{r.get('status')} with {r.get('payment_reference')}")
            elif a.code == "PAYMENT_REFERENCE_USED":
                wrong = payment_member_agrees(ev, pref, body_of(a).get("payment"), False)
                if wrong:
                    yield f"{what(op)}: {wrong}"
                elif fate["reservation_id"] == rid:
                    yield f"{what(op)}: PAYMENT_REFERENCE_USED, but {pref}'s fate is through {rid}"
            elif a.code in REFUND_REASONS:
                rf = a.refund
                if rf is not None:
                    refunded_here = fate is not None and fate["reservation_id"] == rid and \
                        fate["refund_id"] == rf.get("refund_id")
                    own_here = bought_here and own is not None and own["id"] == rf.get("refund_id")
                    if not (refunded_here or own_here):
                        yield (f"{what(op)}: {a.code} with refund {rf.get('refund_id')}, but the "
                               f"recorded fate is {fate}")
                elif not (bought_here and own is None
                          and (ev.res_db.get(rid) or {}).get("status") == "VOIDED"):
                    yield (f"{what(op)}: {a.code} without a refund, but the recorded fate is "
                           f"{fate} (a refund is left out only for a voided sale's own payment "
                           f"voided without one)")


@check("payment_lookups_match_fates",
       "GET /v1/payments/{ref} agrees with the recorded fate: during the load it never shows "
       "another fate, nor 404 once a fate was acknowledged; at the end it shows every sent "
       "reference's fate exactly, and 404 for references never sent. Every reference a "
       "commit carried has a fate once every commit is answered.")
def payment_lookups_match_fates(ev):
    for op in ev.ops_of("payment"):
        pref = op.meta["pref"]
        for a in answered(op):
            if a.status == 200:
                wrong = payment_member_agrees(ev, pref, a.body, False)
                if wrong:
                    yield f"GET {op.path} at {rel(a.t0)}: {wrong}"
            elif a.code == "PAYMENT_NOT_FOUND":
                told = [o for o in ev.commits_by_pref.get(pref, [])
                        if any((x.good or x.code == "PAYMENT_REFERENCE_USED") and x.t1 < a.t0
                               for x in o.attempts)]
                if told:
                    yield (f"GET {op.path} at {rel(a.t0)}: 404, though {what(told[0])} was "
                           f"answered before")
    for pref, a in sorted(ev.payment_gets.items()):
        fate = ev.fate(pref)
        if pref in ev.commits_by_pref and fate is None and \
                all(op.final is not None for op in ev.commits_by_pref[pref]):
            yield f"{pref}: every commit carrying it was answered, yet it has no fate"
        if fate is None:
            if (a.status, a.code) != (404, "PAYMENT_NOT_FOUND"):
                yield f"GET /v1/payments/{pref} (no fate): {a.label()}"
            continue
        if a.status != 200:
            yield f"GET /v1/payments/{pref}: {a.label()}, the database records {fate}"
            continue
        wrong = payment_member_agrees(ev, pref, a.body, True)
        if wrong:
            yield f"GET /v1/payments/{pref}: {wrong}"
            continue
        r = ev.res_db.get(fate["reservation_id"]) or {}
        shown = (body_of(a).get("reservation") or {}).get("status")
        if r.get("status") in ("COMMITTED", "VOIDED", "RELEASED") and shown != r["status"]:
            yield f"GET /v1/payments/{pref}: reservation shown {shown}, database {r['status']}"


# --------------------------------------------------------------------------
# Refunds
# --------------------------------------------------------------------------


@check("refused_payments_carry_their_refund",
       "A commit refused with HOLD_EXPIRED, RESERVATION_NOT_ACTIVE or ALREADY_COMMITTED "
       "carries the refund of that payment on that reservation, with the reason its code "
       "stands for (for a voided sale: SALE_VOIDED); only a voided sale's own payment, "
       "voided without refund, carries none.")
def refused_payments_carry_their_refund(ev):
    for op in ev.ops_of("commit"):
        rid, pref = op.meta["rid"], op.meta["pref"]
        for a in answered(op):
            if a.code not in REFUND_REASONS:
                continue
            rf = a.refund
            if rf is None:
                fate = ev.fate(pref)
                own_unrefunded = fate is not None and fate["reservation_id"] == rid and \
                    fate["refund_id"] is None and ev.own_void_refund(rid, pref) is None and \
                    (ev.res_db.get(rid) or {}).get("status") == "VOIDED"
                if not own_unrefunded:
                    yield (f"{what(op)}: {a.code} without the refund it must carry: "
                           f"{a.raw[:300]!r}")
            elif rf.get("reason") not in REFUND_REASONS[a.code]:
                yield f"{what(op)}: {a.code} with a {rf.get('reason')} refund"
            elif rf.get("reservation_id") != rid or rf.get("payment_reference") != pref:
                yield (f"{what(op)}: refund {rf.get('refund_id')} is about "
                       f"{rf.get('reservation_id')} / {rf.get('payment_reference')}")
            elif op.meta["intent"] in ("commit-after-void", "commit-after-void-new") and \
                    rf.get("reason") != "SALE_VOIDED":
                yield f"{what(op)}: a payment for a voided sale refunded as {rf.get('reason')}"


@check("refunds_answered_are_recorded",
       "Every refund an answer carried is the one refund of that reservation and payment in "
       "the database and in the reservation's GET; the database has no refund nobody was "
       "told about.")
def refunds_answered_are_recorded(ev):
    for (rid, pref), told in sorted(ev.refunds_told.items(), key=str):
        ids = set(told)
        rows = [rf["id"] for rf in ev.refunds_db.get((rid, pref), [])]
        if len(ids) != 1:
            yield f"{rid} / {pref}: answers carried refunds {sorted(map(str, ids))}"
        if len(rows) != 1 or set(rows) != ids:
            yield f"{rid} / {pref}: answered refund {sorted(map(str, ids))}, database has {rows}"
        if rid in ev.state:
            shown = [r.get("refund_id") for r in ev.state[rid].get("refunds", [])
                     if r.get("payment_reference") == pref]
            if set(shown) != ids:
                yield f"{rid} / {pref}: answered refund {sorted(map(str, ids))}, GET shows {shown}"
    for key in sorted(set(ev.refunds_db) - set(ev.refunds_told))[:50]:
        yield f"refund in the database no client was told about: {key}"


@check("voids_refund_as_asked",
       "A void with refund gives the sale's payment back exactly once (SALE_VOIDED), shown in "
       "its answer; one without gives nothing back, then or later.")
def voids_refund_as_asked(ev):
    for rid, op in ev.voided.items():
        pref = ev.committed.get(rid)
        body = next(body_of(a) for a in op.attempts if a.good)
        rows = ev.refunds_db.get((rid, pref), [])
        shown = [rf for rf in body.get("refunds") or [] if rf.get("payment_reference") == pref]
        if op.meta["refund"]:
            if len(rows) != 1 or rows[0]["reason"] != "SALE_VOIDED" or len(shown) != 1 \
                    or shown[0].get("refund_id") != rows[0]["id"]:
                yield (f"{rid} voided with refund: database has "
                       f"{[(r['id'], r['reason']) for r in rows]}, the void answered "
                       f"{[(r.get('refund_id'), r.get('reason')) for r in shown]}")
        elif shown:
            yield f"{rid} voided without refund, yet the void answered refund {shown}"
        elif rows:
            # The sale's own payment keeps its fate: nothing refunds it later.
            yield (f"{rid} voided without refund; its payment {pref} has refund "
                   f"{[(r['id'], r['reason']) for r in rows]}")


# --------------------------------------------------------------------------
# Acknowledged writes stand
# --------------------------------------------------------------------------


@check("acknowledged_holds_exist",
       "Every hold and offer acknowledged (201, or 200 as a replay) is a reservation in the "
       "database that reads back with its asset and buyer; the database has no reservation "
       "nobody was told about but the holds that hand-offs gave to waiters.")
def acknowledged_holds_exist(ev):
    for rid, a in sorted(ev.unread.items()):
        if rid in ev.held:
            yield f"hold {rid} acknowledged but GET answers {a.label()}"
    for rid, op in ev.held.items():
        s = ev.state.get(rid)
        if s and (s.get("asset_id") != op.meta["asset_id"]
                  or s.get("buyer_id") != op.meta["buyer_id"]):
            yield (f"{rid}: GET shows asset {s.get('asset_id')} buyer {s.get('buyer_id')}, "
                   f"hold was for {op.meta}")
    asked = len(ev.res_db) - len(ev.handed)
    if asked != len(ev.hold_keys_ok):
        yield (f"{asked} reservations in the database besides {len(ev.handed)} hand-offs, "
               f"{len(ev.hold_keys_ok)} hold and offer keys acknowledged with 201/200")
    for rid in sorted(set(ev.res_db) - set(ev.held) - set(ev.handed))[:50]:
        yield f"reservation {rid} in the database was never acknowledged"
    for rid in sorted(set(ev.held) - set(ev.res_db))[:50]:
        yield f"acknowledged hold {rid} is not in the database"


@check("acknowledged_sales_stand",
       "Every commit acknowledged (200) is that reservation's one sale: COMMITTED (VOIDED after "
       "an acknowledged void) with that payment, its asset SOLD to it until voided; the "
       "COMMITTED reservations are exactly the acknowledged sales not voided; no asset has two "
       "live sales.")
def acknowledged_sales_stand(ev):
    for rid, prefs in ev.sales.items():
        if len(prefs) > 1:
            yield f"{rid} committed (200) with several payments: {sorted(prefs)}"
    for rid, pref in ev.committed.items():
        s = ev.state.get(rid)
        if not s:
            continue
        want = "VOIDED" if rid in ev.voided else "COMMITTED"
        if s.get("status") != want or s.get("payment_reference") != pref:
            yield (f"commit of {rid} with {pref} acknowledged"
                   f"{', then its void' if rid in ev.voided else ''}; GET shows "
                   f"{s.get('status')} {s.get('payment_reference')}")
    owners = collections.defaultdict(list)
    for rid in ev.committed:
        s = ev.state.get(rid)
        if s and rid not in ev.voided:
            owners[s["asset_id"]].append(rid)
    for aid, rids in owners.items():
        a = ev.assets.get(aid)
        body = body_of(a) if a else {}
        if len(rids) > 1:
            yield f"asset {aid}: sales acknowledged to {rids}, none voided"
        elif a is None or a.status != 200 or body.get("status") != "SOLD" \
                or body.get("current_reservation_id") != rids[0]:
            yield (f"asset {aid} sold to {rids[0]}; GET shows {a.label() if a else None} "
                   f"{body.get('status')} {body.get('current_reservation_id')}")
    sold = collections.Counter(r["asset_id"] for r in ev.res_db.values()
                               if r["status"] == "COMMITTED")
    for aid, n in sold.items():
        if n > 1:
            yield f"asset {aid} has {n} COMMITTED reservations"
    db_committed = {rid: r["payment_reference"] for rid, r in ev.res_db.items()
                    if r["status"] == "COMMITTED"}
    want_committed = {rid: p for rid, p in ev.committed.items() if rid not in ev.voided}
    for rid in sorted(set(db_committed) ^ set(want_committed))[:50]:
        yield (f"{rid}: database COMMITTED with {db_committed.get(rid)}, acknowledged "
               f"{want_committed.get(rid)} (voided: {rid in ev.voided})")
    for rid in sorted(r for r in set(db_committed) & set(want_committed)
                      if db_committed[r] != want_committed[r])[:50]:
        yield f"{rid}: database payment {db_committed[rid]}, acknowledged {want_committed[rid]}"


@check("acknowledged_releases_stand",
       "Every release acknowledged (200) reads RELEASED and was never committed; every "
       "RELEASED reservation had an acknowledged release or a forced withdrawal of its asset "
       "under way.")
def acknowledged_releases_stand(ev):
    for rid in ev.released:
        s = ev.state.get(rid)
        if not s:
            continue
        if s.get("status") == "COMMITTED":
            yield f"{rid} released (200) and later COMMITTED"
        elif s.get("status") != "RELEASED":
            yield f"release of {rid} acknowledged; GET shows {s.get('status')}"
    db_released = {rid for rid, r in ev.res_db.items() if r["status"] == "RELEASED"}
    for rid in sorted(set(ev.released) - db_released)[:50]:
        yield f"{rid}: release acknowledged, database {ev.res_db.get(rid, {}).get('status')}"
    for rid in sorted(db_released - set(ev.released)):
        if not released_by_withdrawal(ev, ev.res_db[rid]):
            r = ev.res_db[rid]
            yield (f"{rid}: RELEASED at {iso(r['released_at'])} with neither a release "
                   f"acknowledged nor a forced withdrawal of {r['asset_id']} under way")


def released_by_withdrawal(ev, r):
    spans = [span(w) for w in ev.assets_ops[r["asset_id"]]["withdraw"] if w.meta["force"]]
    return any(t0 - M <= r["released_at"] <= t1 + M for t0, t1 in spans)


@check("acknowledged_extensions_stand",
       "A hold's expiry is the one its last acknowledged extension answered (only the thread "
       "that holds extends, one request at a time).")
def acknowledged_extensions_stand(ev):
    for rid, exts in ev.extended.items():
        s = ev.state.get(rid)
        if not s:
            continue
        e = parse_ts(s.get("expires_at"))
        last_op, last_e = exts[-1]
        if e is None or last_e is None or abs(e - last_e) > TS_EPS:
            yield (f"{rid}: extension key={last_op.key} acknowledged expires_at "
                   f"{iso(last_e) if last_e else None}; GET shows {s.get('expires_at')} "
                   f"({s.get('status')})")


@check("acknowledged_voids_stand",
       "A void answers VOIDED (or RESERVATION_NOT_ACTIVE for what is not a sale); every void "
       "acknowledged follows an acknowledged sale and reads VOIDED with its payment; the "
       "VOIDED reservations are exactly the acknowledged voids; a voided sale is no asset's "
       "current reservation.")
def acknowledged_voids_stand(ev):
    for op in ev.ops_of("void"):
        for a in answered(op):
            body = body_of(a)
            if a.status == 200 and body.get("status") != "VOIDED":
                yield f"{what(op)}: 200 with status {body.get('status')}"
            elif a.status == 409 and (body.get("reservation") or {}).get("status") == "COMMITTED":
                yield f"{what(op)}: RESERVATION_NOT_ACTIVE for a COMMITTED reservation"
    for rid, op in ev.voided.items():
        s = ev.state.get(rid)
        if rid not in ev.committed:
            yield f"{rid} voided (200) but no commit of it was acknowledged"
        if s and (s.get("status") != "VOIDED" or not s.get("voided_at")
                  or s.get("payment_reference") != ev.committed.get(rid)):
            yield (f"void of {rid} acknowledged; GET shows {s.get('status')} voided_at "
                   f"{s.get('voided_at')} payment {s.get('payment_reference')}")
        aid = (s or {}).get("asset_id")
        a = ev.assets.get(aid)
        if a is not None and body_of(a).get("current_reservation_id") == rid:
            yield f"asset {aid} still {body_of(a).get('status')} to voided {rid}"
    db_voided = {rid for rid, r in ev.res_db.items() if r["status"] == "VOIDED"}
    for rid in sorted(db_voided ^ set(ev.voided))[:50]:
        yield f"{rid}: VOIDED in database {rid in db_voided}, void acknowledged {rid in ev.voided}"
    for rid in sorted(db_voided):
        r = ev.res_db[rid]
        if r["voided_at"] is None or r["committed_at"] is None or \
                r["voided_at"] < r["committed_at"]:
            yield f"{rid}: voided_at {r['voided_at']} before committed_at {r['committed_at']}"
    for asset in ev.db["assets"]:
        cur = ev.res_db.get(asset["current_reservation_id"] or "")
        if cur is not None and cur["status"] == "VOIDED":
            yield f"asset {asset['id']} is {asset['status']} by voided {cur['id']}"


# --------------------------------------------------------------------------
# Time: expiry, late payments, extensions
# --------------------------------------------------------------------------


@check("live_holds_not_refused",
       "HOLD_EXPIRED is never answered before the hold's expiry.")
def live_holds_not_refused(ev):
    for op in ev.ops_of("commit"):
        last = op.attempts[-1]
        if any(a.code == "HOLD_EXPIRED" for a in op.attempts if a.good) and \
                last.t1 < ev.expiry(op) - M:
            yield (f"{op.meta['rid']}: HOLD_EXPIRED answered {ev.expiry(op) - last.t1:.2f}s "
                   f"before expires_at")


def late_sales(ev):
    """The reservations sold after their expiry (database clock)."""
    return [r for r in ev.res_db.values() if r["status"] in ("COMMITTED", "VOIDED")
            and r["committed_at"] > r["expires_at"] + 1e-5]


@check("late_payments_by_mode",
       "A payment after the hold's expiry buys the asset only through an accept-if-free "
       "instance and only when nobody held the asset since; an accept-if-free instance "
       "refuses a late payment it decides only when someone held the asset since or it was "
       "withdrawn.")
def late_payments_by_mode(ev):
    modes = ev.cluster.op_modes
    for r in late_sales(ev):
        deciders = [op for op in ev.sales.get(r["id"], {}).get(r["payment_reference"], [])
                    if span(op)[0] - M <= r["committed_at"] <= span(op)[1] + M]
        if deciders and not any("accept-if-free" in modes(op) for op in deciders):
            yield (f"{r['id']}: committed {r['committed_at'] - r['expires_at']:.2f}s after "
                   f"expires_at by instances that refund late payments")
        since = [o["id"] for o in ev.res_by_asset[r["asset_id"]] if o["id"] != r["id"]
                 and r["created_at"] <= o["created_at"] <= r["committed_at"]]
        if since:
            yield f"{r['id']}: sold to a late payment though {since} held {r['asset_id']} since"
    for rid, pref, rf in refused_late_by_accepting(ev):
        r = ev.res_db.get(rid)
        if r is None:
            continue
        t = rf["created_at"]
        since = [o["id"] for o in ev.res_by_asset[r["asset_id"]] if o["id"] != rid
                 and r["created_at"] <= o["created_at"] <= t + 1e-5]
        gone = [w for w in ev.withdrawals_db[r["asset_id"]]
                if r["expires_at"] - 1e-5 <= w <= t + 1e-5]
        if not since and not gone:
            yield (f"{rid}: late payment {pref} refunded at {iso(t)} by accept-if-free "
                   f"instances though nobody held {r['asset_id']} since and it was not withdrawn")


def refused_late_by_accepting(ev):
    """(rid, pref, refund row) of each HOLD_EXPIRED refund decided only by
    accept-if-free instances: every commit of that payment to that
    reservation under way when the refund was written reached only them."""
    seen = set()
    for op in ev.ops_of("commit"):
        a = next((a for a in op.attempts if a.good and a.code == "HOLD_EXPIRED"), None)
        if a is None:
            continue
        rid, pref = op.meta["rid"], op.meta["pref"]
        rf = ev.refund_by_id.get((a.refund or {}).get("refund_id"))
        if rf is None or rf["id"] in seen:
            continue  # reported by the refund checks
        seen.add(rf["id"])
        deciders = [o for o in ev.commits_by_pref[pref] if o.meta["rid"] == rid
                    and span(o)[0] - M <= rf["created_at"] <= span(o)[1] + M]
        if deciders and all(ev.cluster.op_modes(o) == {"accept-if-free"} for o in deciders):
            yield rid, pref, rf


@check("late_releases_refused",
       "A release first sent after the hold's expiry is refused (unless the reservation was "
       "released before, by a forced withdrawal); no reservation is released after its expiry.")
def late_releases_refused(ev):
    for op in ev.ops_of("release"):
        if op.meta["intent"] == "release-again" or not any(a.status == 200 for a in op.attempts):
            continue
        first = op.attempts[0]
        body = next(body_of(a) for a in op.attempts if a.status == 200)
        ended = parse_ts(body.get("released_at"))
        if first.t0 > ev.expiry(op) + M and (ended is None or ended > first.t0 - M):
            yield (f"{op.meta['rid']}: release first sent {first.t0 - ev.expiry(op):.2f}s after "
                   f"expires_at was answered 200")
    for rid, r in ev.res_db.items():
        if r["status"] == "RELEASED" and r["released_at"] > r["expires_at"] + 1e-5:
            yield f"{rid}: released_at {iso(r['released_at'])} after expires_at {iso(r['expires_at'])}"


@check("extensions_follow_the_clock",
       "An extension answered 200 keeps the hold HELD and moves its expiry to hold_seconds "
       "from the request, within the cap on a hold's life; one first sent after the expiry is "
       "refused; HOLD_EXTENSION_LIMIT only past the cap, RESERVATION_NOT_ACTIVE only for a "
       "hold that is over.")
def extensions_follow_the_clock(ev):
    for op in ev.ops_of("extend"):
        n = op.meta["seconds"]
        for a in answered(op):
            body = body_of(a)
            rsv = body if a.status == 200 else body.get("reservation") or {}
            if a.status == 200:
                e = parse_ts(body.get("expires_at"))
                good = [x for x in op.attempts if x.status == 200]
                lo, hi = op.attempts[0].t0 + n - M, good[0].t1 + n + M
                if body.get("status") != "HELD" or e is None:
                    yield f"{what(op)}: 200 with status {body.get('status')}"
                elif not lo <= e <= hi:
                    yield (f"{what(op)}: expires_at {body.get('expires_at')} is not {n}s after "
                           f"the request (off by {min(abs(e - lo), abs(e - hi)):.2f}s)")
                elif e - op.meta["created_at"] > HOLD_MAX_TOTAL_SECONDS + TS_EPS:
                    yield (f"{what(op)}: extended to {e - op.meta['created_at']:.2f}s from "
                           f"creation, over the {HOLD_MAX_TOTAL_SECONDS}s cap")
                if op.attempts[0].t0 > op.meta["expires_at"] + M:
                    yield (f"{what(op)}: first sent "
                           f"{op.attempts[0].t0 - op.meta['expires_at']:.2f}s after the hold "
                           f"lapsed, answered 200")
            elif a.code == "HOLD_EXTENSION_LIMIT":
                if a.t1 + n < op.meta["created_at"] + HOLD_MAX_TOTAL_SECONDS - M:
                    yield (f"{what(op)}: HOLD_EXTENSION_LIMIT though now+{n}s stays "
                           f"{op.meta['created_at'] + HOLD_MAX_TOTAL_SECONDS - a.t1 - n:.2f}s "
                           f"within the cap")
            elif a.code == "RESERVATION_NOT_ACTIVE" and rsv.get("status") == "HELD":
                yield f"{what(op)}: RESERVATION_NOT_ACTIVE for a HELD reservation"


# --------------------------------------------------------------------------
# Withdrawals and sale openings
# --------------------------------------------------------------------------


def certain_intervals(ev):
    """asset_id -> (withdrawn, gated): the intervals in which the client
    knew for certain that the asset was withdrawn (from a withdrawal's
    answer to the first reinstatement that might have undone it) or not yet
    on sale (from an opening's answer to the opening, or to the first other
    opening set meanwhile)."""
    cached = getattr(ev, "_certain_intervals", None)
    if cached is not None:
        return cached
    out = {}
    for aid, kinds in ev.assets_ops.items():
        withdrawn, gated = [], []
        for w in kinds["withdraw"]:
            ack = next((a for a in w.attempts if a.status == 200), None)
            if ack is None:
                continue
            end = min([span(r)[0] for r in kinds["reinstate"] if span(r)[1] > span(w)[0]],
                      default=float("inf"))
            if ack.t1 < end:
                withdrawn.append((ack.t1, end))
        gates = [g for g in kinds["gate"] + kinds["create_asset"]
                 if g.meta.get("available_from") or g.kind == "gate"]
        for g in gates:
            ack = next((a for a in g.attempts if a.status in (200, 201)), None)
            t = parse_ts(body_of(ack).get("available_from")) if ack is not None else None
            if t is None:
                continue
            end = min([t - M] + [span(o)[0] for o in gates
                                 if o is not g and span(o)[1] > span(g)[0]])
            if ack.t1 < end:
                gated.append((ack.t1, end, t))
        out[aid] = (withdrawn, gated)
    ev._certain_intervals = out
    return out


@check("withdrawn_assets_refuse_holds",
       "No hold is granted and no sale made while its asset is certainly withdrawn; "
       "WITHDRAWN is never reported before a withdrawal was sent; a WITHDRAWN asset has no "
       "live hold; a withdrawal answers WITHDRAWN, ASSET_HELD (never when forced) or "
       "ASSET_SOLD; a reinstatement answers WITHDRAWN only while a withdrawal is under way.")
def withdrawn_assets_refuse_holds(ev):
    intervals = certain_intervals(ev)
    for aid, kinds in ev.assets_ops.items():
        withdrawn, _ = intervals[aid]
        first_withdraw = min((span(w)[0] for w in kinds["withdraw"]), default=float("inf"))
        for op in kinds["hold"]:
            for a in op.attempts:
                if a.status == 201 and any(s <= a.t0 and a.t1 <= e for s, e in withdrawn):
                    yield (f"hold key={op.key} of {aid} answered 201 in [{rel(a.t0)}, "
                           f"{rel(a.t1)}], after its withdrawal was acknowledged and before any "
                           f"reinstatement was sent")
                elif a.code == "ASSET_UNAVAILABLE" and \
                        body_of(a).get("asset_status") == "WITHDRAWN" and a.t1 < first_withdraw:
                    yield f"hold key={op.key} of {aid}: WITHDRAWN before any withdrawal was sent"
        for op in kinds["commit"]:
            for a in op.attempts:
                if a.status == 200 and not a.replayed and \
                        any(s <= a.t0 and a.t1 <= e for s, e in withdrawn):
                    yield f"commit key={op.key} of {aid} answered 200 while it was withdrawn"
        for op in kinds["reinstate"]:
            for a in op.attempts:
                if a.status == 200 and body_of(a).get("status") == "WITHDRAWN" and \
                        not any(span(w)[0] <= a.t1 and span(w)[1] >= a.t0
                                for w in kinds["withdraw"]):
                    yield f"reinstate of {aid} answered WITHDRAWN with no withdrawal under way"
        for op in kinds["withdraw"]:
            for a in answered(op):
                body = body_of(a)
                asset = body if a.status == 200 else body.get("asset") or {}
                want = {"ASSET_HELD": "HELD", "ASSET_SOLD": "SOLD"}
                expect = "WITHDRAWN" if a.status == 200 else want.get(a.code)
                if asset.get("status") != expect:
                    yield (f"{what(op)} force={op.meta['force']}: {a.label()} with asset status "
                           f"{asset.get('status')}")
                if a.code == "ASSET_HELD" and op.meta["force"]:
                    yield f"{what(op)}: a forced withdrawal answered ASSET_HELD"
    for asset in ev.db["assets"]:
        if asset["status"] == "WITHDRAWN":
            live = [o["id"] for o in ev.res_by_asset[asset["id"]] if o["status"] == "HELD"]
            if asset["current_reservation_id"] is not None or live:
                yield (f"asset {asset['id']} WITHDRAWN with current reservation "
                       f"{asset['current_reservation_id']} and HELD reservations {live}")


@check("sales_open_on_time",
       "No hold is granted while its sale has certainly not opened; SALE_NOT_OPEN names an "
       "opening a client set, and never one already past; an opening set answers what was "
       "asked.")
def sales_open_on_time(ev):
    intervals = certain_intervals(ev)
    for aid, kinds in ev.assets_ops.items():
        _, gated = intervals[aid]
        for op in kinds["hold"]:
            for a in op.attempts:
                if a.status == 201:
                    for s, e, t in gated:
                        if s <= a.t0 and a.t1 <= e:
                            yield (f"hold key={op.key} of {aid} answered 201 {t - a.t1:.2f}s "
                                   f"before its sale opened at {iso(t)}")
                elif a.code == "SALE_NOT_OPEN":
                    body = body_of(a)
                    t = parse_ts(body.get("available_from"))
                    if t is None or not any(abs(t - k) < TS_EPS for k in ev.gate_values[aid]):
                        yield (f"{what(op)}: SALE_NOT_OPEN until {body.get('available_from')}, "
                               f"which no client set")
                    elif t <= a.t0 - M:
                        yield (f"{what(op)}: SALE_NOT_OPEN sent {a.t0 - t:.2f}s after the sale "
                               f"opened ({body.get('available_from')})")
        for op in kinds["gate"]:
            for a in answered(op):
                want, got = op.meta["available_from"], body_of(a).get("available_from")
                if (want is None) != (got is None) or \
                        (want is not None and abs(parse_ts(want) - (parse_ts(got) or 0)) > TS_EPS):
                    yield f"{what(op)}: asked available_from {want}, answered {got}"


@check("holds_say_why_not",
       "A refused hold says why: ASSET_UNAVAILABLE with asset_status HELD, SOLD or WITHDRAWN.")
def holds_say_why_not(ev):
    for op in ev.ops_of("hold"):
        for a in answered(op):
            if a.code == "ASSET_UNAVAILABLE" and \
                    body_of(a).get("asset_status") not in ("HELD", "SOLD", "WITHDRAWN"):
                yield (f"{what(op)}: ASSET_UNAVAILABLE with asset_status "
                       f"{body_of(a).get('asset_status')!r}")


# --------------------------------------------------------------------------
# Waiting lists
# --------------------------------------------------------------------------


def queue_replay(ev):
    """Each asset's holds in its own order, with the waiters the events say
    had left the queue before each: [(asset, event, gone)], where gone is
    the set of waiters handed the asset, passed over or cleared before it."""
    out, gone, asset = [], set(), None
    for e in ev.db["queue_events"]:
        if e["asset_id"] != asset:
            asset, gone = e["asset_id"], set()
        d = e["data"]
        if e["type"] == "reservation.held":
            out.append((asset, e, frozenset(gone)))
            if e["via"] == "waitlist":
                gone.add(d.get("buyer_id"))
        elif e["type"] == "waitlist.skipped":
            gone.add(d.get("buyer_id"))
        elif e["type"] == "waitlist.cleared":
            gone.update(x.get("buyer_id") for x in d.get("entries") or [])
    return out


@check("nobody_jumps_the_queue",
       "No hold or offer was made, by anyone outside the queue, while a waiter was queued: for "
       "every hold or offer acknowledged, no waiter of that asset had its join acknowledged "
       "before the request was sent while neither asking to leave before it was answered nor "
       "being handed the asset, passed over or cleared (events, in the asset's order) before "
       "it.")
def nobody_jumps_the_queue(ev):
    waiters = collections.defaultdict(list)
    for (asset, waiter), (_, acked) in ev.joins.items():
        if acked is not None:
            waiters[asset].append((waiter, acked))
    for asset, e, gone in queue_replay(ev):
        if e["via"] == "waitlist":
            continue
        op = ev.held.get(e["data"].get("reservation_id"))
        if op is None:
            continue
        sent, done = span(op)
        for waiter, acked in waiters.get(asset, []):
            if acked < sent and waiter not in gone and \
                    ev.leaves.get((asset, waiter), math.inf) > done:
                yield (f"{what(op)}: {e['data'].get('reservation_id')} held {asset} for "
                       f"{e['data'].get('buyer_id')} (event {e['sequence']}) while {waiter}, "
                       f"queued at {iso(acked)}, was still waiting")


@check("hand_offs_follow_the_queue",
       "Every hold a hand-off gave went to a buyer that had asked to queue for that asset, "
       "once, and never past a waiter whose join was acknowledged before that buyer's was sent "
       "and who had neither asked to leave nor been handed the asset, passed over or cleared.")
def hand_offs_follow_the_queue(ev):
    seen = collections.Counter()
    for asset, e, gone in queue_replay(ev):
        if e["via"] != "waitlist":
            continue
        buyer = e["data"].get("buyer_id")
        seen[(asset, buyer)] += 1
        if (asset, buyer) not in ev.joins:
            yield f"{asset} handed to {buyer} (event {e['sequence']}), who never asked to queue"
            continue
        sent, _ = ev.joins[(asset, buyer)]
        for (a, waiter), (_, acked) in ev.joins.items():
            if a == asset and acked is not None and acked < sent and waiter not in gone \
                    and (asset, waiter) not in ev.leaves:
                yield (f"{asset} handed to {buyer} (event {e['sequence']}) past {waiter}, "
                       f"queued before it and still waiting")
    for (asset, buyer), n in seen.items():
        if n > 1:
            yield f"{asset} handed to {buyer} {n} times"
    for rid, r in ev.handed.items():
        if (r["asset_id"], r["buyer_id"]) not in ev.joins:
            yield f"{rid}: a hand-off's hold for {r['buyer_id']}, who never queued"


# --------------------------------------------------------------------------
# Reading: listings and timelines
# --------------------------------------------------------------------------


@check("listings_agree",
       "Reservation listings are newest first, page by page without overlap, within their "
       "limit and filters; at the end each listing is exactly the database's reservations "
       "for its filter.")
def listings_agree(ev):
    for op in ev.ops_of("list"):
        meta = op.meta
        for a in answered(op):
            items = body_of(a).get("items")
            if not isinstance(items, list):
                yield f"GET {op.path}: no items: {a.raw[:200]!r}"
                continue
            ids = [it.get("reservation_id") or "" for it in items]
            if any(ids[i] <= ids[i + 1] for i in range(len(ids) - 1)):
                yield f"GET {op.path}: not newest first: {ids[:10]}"
            if meta["prev_last"] and ids and ids[0] >= meta["prev_last"]:
                yield f"GET {op.path}: the next page starts at {ids[0]}, not after {meta['prev_last']}"
            cursor = body_of(a).get("next_cursor")
            if len(items) > meta["limit"] or (cursor and len(items) < meta["limit"]):
                yield f"GET {op.path}: {len(items)} items for limit {meta['limit']}, next_cursor {cursor!r}"
            for it in items:
                for field, value in meta["filters"].items():
                    if it.get(field) != value:
                        yield f"GET {op.path}: item {it.get('reservation_id')} has {field} {it.get(field)!r}"
    for query, items, error, _pages in ev.listings:
        if error:
            yield error
            continue
        field, value = next((k, q) for k, q in query.items() if k != "limit")
        want = sorted((rid for rid, r in ev.res_db.items() if r[field] == value), reverse=True)
        ids = [it.get("reservation_id") for it in items]
        if ids != want:
            yield (f"GET /v1/reservations?{field}={value} (limit {query['limit']}): {len(ids)} "
                   f"items, database {len(want)}; missing {sorted(set(want) - set(ids))[:3]}, "
                   f"extra {sorted(set(ids) - set(want))[:3]}, order ok "
                   f"{ids == sorted(ids, reverse=True)}")
        for it in items:
            r = ev.res_db.get(it.get("reservation_id"))
            if r and r["status"] in ("COMMITTED", "VOIDED", "RELEASED") \
                    and it.get("status") != r["status"]:
                yield f"listing shows {r['id']} {it.get('status')}, database {r['status']}"


# The events that name their actor (the API key; '-' in open mode), those
# that never do, and the rest (a forced withdrawal's release, a void's
# refund) that may.
ACTED = {"reservation.voided", "asset.withdrawn", "asset.reinstated"}
NEVER_ACTED = {"reservation.held", "reservation.committed", "reservation.expired",
               "reservation.extended", "refund.completed"}


@check("timelines_agree",
       "An asset's timeline, read page by page, is its events in the database in sequence "
       "order 1, 2, 3 … (plus expiries written since), in as many pages as its limit makes; "
       "voids, withdrawals, reinstatements and offers name their actor ('-' in open mode), "
       "other holds, sales, expiries and extensions none.")
def timelines_agree(ev):
    for (aid, limit), items, error, pages in ev.timelines:
        if error:
            yield f"timeline of {aid}: {error}"
            continue
        seqs = [it.get("sequence") for it in items]
        if seqs != list(range(1, len(items) + 1)):
            yield f"timeline of {aid}: sequences {seqs[:20]}"
        db = [(e["sequence"], e["type"], e["actor"]) for e in ev.events_by_asset[aid]]
        api = [(it.get("sequence"), it.get("type"), it.get("actor")) for it in items]
        if api[:len(db)] != db or any(t != "reservation.expired" for _, t, _ in api[len(db):]):
            diff = next((i for i, (x, y) in enumerate(zip(api, db)) if x != y),
                        min(len(api), len(db)))
            yield (f"timeline of {aid}: {len(api)} events, database {len(db)}; first "
                   f"difference at {diff}: {api[diff:diff + 1]} vs {db[diff:diff + 1]}")
        if pages != max(1, math.ceil(len(items) / limit)):
            yield f"timeline of {aid}: {len(items)} events in {pages} pages of {limit}"
        for it in items:
            seq, kind, actor = it.get("sequence"), it.get("type"), it.get("actor")
            if kind == "reservation.held" and it.get("via") == "offer":
                if actor != "-":
                    yield f"timeline of {aid}: offer {seq} with actor {actor!r}"
            elif kind in ACTED and actor != "-" or kind in NEVER_ACTED and actor is not None:
                yield f"timeline of {aid}: event {seq} {kind} with actor {actor!r}"

"""A bounded chaos run against holdfast, on PostgreSQL and/or SQLite.

    python3 ci/chaos.py [--backend postgres|sqlite|both|failover] [--seconds N] [--bin PATH]
                        [--late-commit mixed|refund|accept-if-free]

PostgreSQL: a fresh database, three instances on it (janitors every second),
~200 seeded assets and two dozen client threads holding, extending holds,
committing (at once and late, past the hold's expiry), releasing, voiding
sales, withdrawing and reinstating assets, gating sales with available_from,
listing reservations, looking payments up, and blindly retrying with the same
Idempotency-Key and body after any connection error, timeout or 503 (on
another instance). Some commits carry a payment reference already sent for
another reservation (sold, refunded, or in flight), and some send one
reference to several holds at the same moment. Mid-run one instance is killed
with SIGKILL and started again a few seconds later, and later PostgreSQL
itself is restarted. With --late-commit mixed (the default) the third
instance runs HOLDFAST_LATE_COMMIT=accept-if-free, the others refund late
payments.

Failover (--backend failover, not part of "both"): the same load on a
primary and its synchronous streaming standby, private clusters of the run,
through the multi-host URL `postgres://…@primary,standby/…?target_session_attrs
=read-write`. Mid-run the primary is stopped `immediate` and, a few seconds
later, the standby promoted and told to stop waiting for a standby of its own
(as Patroni does); every instance must serve again within seconds, and the
checks then judge every answer against the new primary.

SQLite: one instance on a file, a dozen client threads, the instance killed
with SIGKILL mid-run and started again on the same file (with mixed: it
refunds late payments before the kill and accepts them if free after).

Then, with every instance answering again, requests left without an answer
are retried with their key until they get one, the evidence is gathered (the
client's record of every answer, `holdfast audit --json`, every reservation,
payments, some listings and timelines read back, the database read directly)
and every check registered in checks.CHECKS is run on it. Any violation makes
the exit status 1. Python standard library only.

Layout: cluster (instances, PostgreSQL, faults, the database read back),
client (requests, attempts, blind retries), workload (the client threads),
contract (what openapi/holdfast.json allows, and the run's own claims),
evidence (what the checks judge), checks (the invariants), report (figures),
main (the run).
"""

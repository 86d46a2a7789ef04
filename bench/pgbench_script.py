"""Turns the service's hold statements (printed by `examples/hold_sql`) into
a pgbench script: the same SQL, in the same transactions, with each client
holding its own assets P-<client>-<n>."""
import sys

snapshot, lock, hold = (part.strip() for part in sys.stdin.read().split("---"))

def ident(prefix):
    return f"('{prefix}' || :client_id || '-' || :n)"

body = '{"reservation_id":"res_01M8MERA64F7EYSX8WNCR721TE","asset_id":"P-0-1","buyer_id":"b-0-1","status":"HELD","expires_at":"2026-11-29T20:18:17.299730Z","created_at":"2026-11-29T20:08:17.299730Z","committed_at":null,"released_at":null,"payment_reference":null,"refunds":[]}'
values = {
    1: ident("P-"),
    2: ident("res_"),
    3: ident("b-"),
    4: "now()",
    5: "(now() + interval '600 seconds')",
    6: ident("evt_"),
    7: "'" + body + "'",
    8: "'-'",
    9: ident("k-"),
    10: "'" + "ab" * 32 + "'",
    11: "201",
    12: ident("/v1/reservations/res_"),
    13: "'-'",
    14: "5",
}

def bind(sql, values):
    for number in sorted(values, reverse=True):
        sql = sql.replace(f"${number}", values[number])
    return " ".join(sql.split())

print("\\set n :n + 1")
# The snapshot reads for a batch of requests; here, a batch of one.
print(bind(snapshot, {n: f"ARRAY[{values[v]}]" for n, v in ((1, 1), (2, 8), (3, 9))}) + ";")
print("BEGIN;")
print(bind(lock, {1: values[13], 2: values[3]}) + ";")
print(bind(hold, values) + ";")
print("COMMIT;")

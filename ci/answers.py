#!/usr/bin/env python3
"""Every answer of a tour of the API, validated against the document.

schemathesis generates requests from the document; few of them reach a
commit refused with its refund, a void, an offer or a cleared queue. This
tour does, as the three roles, and validates each answer (its status's
schema: a reservation, a problem of one `error_code`, an event of each
`data_kind`) against openapi/holdfast.json, so that a member the document
requires is sent wherever the service answers.

    usage: ci/answers.py BASE_URL ADMIN_TOKEN STOREFRONT_TOKEN PAYMENTS_TOKEN

The service must know the storefront key under the name `plates-web` (the
offer names it). Exits 1 when an answer does not match, or a step answers
another status than the tour expects.
"""

import datetime
import json
import os
import sys
import urllib.error
import urllib.request
import uuid

import jsonschema

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Tour:
    def __init__(self, base, doc):
        self.base = base.rstrip("/")
        self.doc = doc
        self.failures = []
        self.checked = 0

    def send(self, token, method, template, path=None, body=None, key=None):
        request = urllib.request.Request(
            self.base + (path or template), method=method,
            data=None if body is None else json.dumps(body).encode())
        request.add_header("Authorization", "Bearer " + token)
        if body is not None:
            request.add_header("Content-Type", "application/json")
        if key:
            request.add_header("Idempotency-Key", key)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        answer = json.loads(raw) if raw else None
        self.validate(method, template, path or template, status, answer)
        return status, answer

    def validate(self, method, template, path, status, answer):
        """The answer against its status's schema, in the document itself
        (so that its `$ref`s resolve)."""
        self.checked += 1
        responses = self.doc["paths"][template][method.lower()]["responses"]
        declared = responses.get(str(status))
        if declared is None:
            self.failures.append(f"{method} {path}: {status} is not in the document")
            return
        content = declared.get("content")
        if not content:
            return
        schema = next(iter(content.values()))["schema"]
        root = dict(self.doc, allOf=[schema])
        for error in jsonschema.Draft202012Validator(root).iter_errors(answer):
            where = "/".join(str(p) for p in error.absolute_path)
            self.failures.append(f"{method} {path} {status} at /{where}: {error.message[:300]}")

    def expect(self, wanted, result, step):
        status, answer = result
        code = answer.get("error_code") if isinstance(answer, dict) else None
        if (status, code) != wanted:
            self.failures.append(f"{step}: expected {wanted}, got {(status, code)}")
        return answer


def main():
    if len(sys.argv) != 5:
        print("usage: ci/answers.py BASE_URL ADMIN_TOKEN STOREFRONT_TOKEN PAYMENTS_TOKEN",
              file=sys.stderr)
        return 2
    base, admin, shop, psp = sys.argv[1:]
    with open(os.path.join(ROOT, "openapi/holdfast.json")) as f:
        tour = Tour(base, json.load(f))
    run = uuid.uuid4().hex[:8]
    asset = lambda n: f"T{run}-{n}"  # noqa: E731
    key = lambda n: f"tour-{run}-{n}"  # noqa: E731
    ok, created = (200, None), (201, None)
    in_two_days = (datetime.datetime.now(datetime.timezone.utc)
                   + datetime.timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    send, expect = tour.send, tour.expect

    for n in range(8):
        expect(created, send(admin, "POST", "/v1/assets", body={
            "id": asset(n), "name": "tour", "price": {"amount": 500, "currency": "EUR"},
            "attributes": {"n": n}}), "create")
    hold = "/v1/assets/{asset_id}/reservations"
    holds = []
    for n in range(6):
        status, held = send(shop, "POST", hold, f"/v1/assets/{asset(n)}/reservations",
                            {"buyer_id": f"b-{run}", "hold_seconds": 600,
                             "metadata": {"cart": str(n)}}, key(f"h{n}"))
        if n < 5:
            expect(created, (status, held), "hold")
            holds.append(held["reservation_id"])
        else:
            expect((409, "HOLD_LIMIT_REACHED"), (status, held), "sixth hold")
    first, second, third = holds[:3]
    expect((409, "ASSET_UNAVAILABLE"), send(shop, "POST", hold, f"/v1/assets/{asset(0)}/reservations",
                                            {"buyer_id": f"rival-{run}"}, key("rival")), "rival")
    waitlist = "/v1/assets/{asset_id}/waitlist"
    expect(created, send(shop, "POST", waitlist, f"/v1/assets/{asset(2)}/waitlist",
                         {"buyer_id": f"w-{run}"}, key("w1")), "join")
    expect(ok, send(shop, "GET", waitlist, f"/v1/assets/{asset(2)}/waitlist"), "waitlist")
    expect((409, "ASSET_HELD"), send(admin, "POST", "/v1/assets/{asset_id}/withdraw",
                                     f"/v1/assets/{asset(0)}/withdraw", {}), "withdraw held")
    commit = "/v1/reservations/{reservation_id}/commit"
    expect((409, "PAYMENT_AMOUNT_MISMATCH"), send(psp, "POST", commit, f"/v1/reservations/{first}/commit", {
        "payment_reference": f"short-{run}", "amount": {"amount": 1, "currency": "EUR"}}, key("c0")), "short")
    expect(ok, send(psp, "POST", commit, f"/v1/reservations/{first}/commit",
                    {"payment_reference": f"pay-{run}"}, key("c1")), "commit")
    expect((409, "ALREADY_COMMITTED"), send(psp, "POST", commit, f"/v1/reservations/{first}/commit",
                                            {"payment_reference": f"again-{run}"}, key("c2")), "again")
    expect((409, "PAYMENT_REFERENCE_USED"), send(psp, "POST", commit, f"/v1/reservations/{second}/commit",
                                                 {"payment_reference": f"pay-{run}"}, key("c3")), "reused")
    expect((409, "ASSET_SOLD"), send(admin, "POST", "/v1/assets/{asset_id}/withdraw",
                                     f"/v1/assets/{asset(0)}/withdraw", {}), "withdraw sold")
    expect(ok, send(shop, "POST", "/v1/reservations/{reservation_id}/release",
                    f"/v1/reservations/{second}/release", {}, key("r1")), "release")
    expect((409, "RESERVATION_NOT_ACTIVE"), send(psp, "POST", commit, f"/v1/reservations/{second}/commit",
                                                 {"payment_reference": f"late-{run}"}, key("c4")), "released")
    expect(ok, send(admin, "POST", "/v1/reservations/{reservation_id}/void",
                    f"/v1/reservations/{first}/void", {}, key("v1")), "void")
    expect(ok, send(psp, "GET", "/v1/payments/{payment_reference}", f"/v1/payments/pay-{run}"), "payment")
    # Handed to the waiter on release, then the queue of another asset
    # cleared by a forced withdrawal.
    expect(ok, send(shop, "POST", "/v1/reservations/{reservation_id}/release",
                    f"/v1/reservations/{third}/release", {}, key("r2")), "hand-off")
    expect(created, send(shop, "POST", waitlist, f"/v1/assets/{asset(3)}/waitlist",
                         {"buyer_id": f"w2-{run}"}, key("w2")), "join")
    expect(ok, send(admin, "POST", "/v1/assets/{asset_id}/withdraw", f"/v1/assets/{asset(3)}/withdraw",
                    {"force": True}), "forced withdrawal")
    expect(created, send(admin, "POST", "/v1/assets/{asset_id}/offers", f"/v1/assets/{asset(6)}/offers", {
        "buyer_id": f"o-{run}", "client": "plates-web", "expires_at": in_two_days},
        key("o1")), "offer")
    # Another client's hold: a storefront sees its events as summaries.
    expect(created, send(admin, "POST", hold, f"/v1/assets/{asset(5)}/reservations",
                         {"buyer_id": f"b-{run}"}, key("admin-hold")), "admin's hold")
    expect((409, "ASSET_EXISTS"), send(admin, "POST", "/v1/assets/batch", body={
        "items": [{"id": asset(7), "name": "other"}]}, key="b1"), "batch")
    expect((422, "VALIDATION_FAILED"), send(shop, "POST", hold, f"/v1/assets/{asset(7)}/reservations",
                                            {"buyer_id": ""}, key("bad")), "invalid")
    expect((404, "ASSET_NOT_FOUND"), send(shop, "GET", "/v1/assets/{asset_id}",
                                          f"/v1/assets/{asset('none')}"), "unknown")

    kinds = {}
    for token, role in ((admin, "admin"), (shop, "storefront"), (psp, "payments")):
        for template, path in (("/v1/assets", f"/v1/assets?id_prefix=T{run}"),
                               ("/v1/reservations", f"/v1/reservations?buyer_id=b-{run}"),
                               ("/v1/assets/{asset_id}/events", f"/v1/assets/{asset(0)}/events"),
                               ("/v1/assets/{asset_id}/events", f"/v1/assets/{asset(2)}/events"),
                               ("/v1/assets/{asset_id}/events", f"/v1/assets/{asset(3)}/events"),
                               ("/v1/assets/{asset_id}/events", f"/v1/assets/{asset(5)}/events")):
            expect(ok, send(token, "GET", template, path), f"{role} {path}")
        _, events = send(token, "GET", "/v1/events", "/v1/events?limit=500")
        kinds[role] = sorted({e["data_kind"] for e in (events or {}).get("items", [])})
    if "summary" not in kinds["storefront"]:
        tour.failures.append("the storefront saw no event of another client's reservation")
    expect(ok, send(psp, "GET", "/v1/refunds", "/v1/refunds?limit=200"), "refunds")

    print(f"answers: {tour.checked} answers checked against the document; "
          f"event data kinds seen: {kinds}")
    for failure in tour.failures:
        print("  " + failure)
    if tour.failures:
        print(f"answers: FAILED ({len(tour.failures)})")
        return 1
    print("answers: every answer matches the document")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What an answer may be. The service's own document (openapi/holdfast.json)
says which statuses and `error_code`s each operation may answer; this module
reads it, and adds only what the chaos run itself claims: which documented
answers its well-formed, open-mode requests can never earn, and which answer
a given flow (intent) must get."""

from __future__ import annotations

import json

from .common import DOCUMENT

# The document's answers that this run's requests cannot earn, by status or
# error_code, and why. Each is a claim of the checker about its own client.
UNEARNED = {
    400: "every body is a JSON object and every Idempotency-Key is valid",
    401: "the instances run in open mode (no API keys)",
    403: "the instances run in open mode (no API keys)",
    404: "clients name only assets and reservations that exist",
    413: "every body is small",
    415: "every body is application/json",
    422: "every field keeps its rules, and each key is sent with one request only",
    "HOLD_LIMIT_REACHED": "the instances set no per-buyer hold limit",
}
# ...except where the run asks for something that may not exist.
EARNED_ANYWAY = {
    # A lookup may name a reference before it has a fate, or one never sent.
    ("get_payment", 404),
    # A waiter may ask to leave after a hand-off, a sale or a withdrawal took
    # it off the queue.
    ("leave_waitlist", 404),
}

# Flows whose answer is known in advance, narrower than the document's.
BY_INTENT = {
    # A voided sale's payment keeps its fate (it bought that sale): sent for
    # another reservation, it is used.
    "reuse-voided-payment": {(409, "PAYMENT_REFERENCE_USED")},
    # The voided sale's own payment again, or a new one for the voided sale.
    "commit-after-void": {(409, "RESERVATION_NOT_ACTIVE")},
    "commit-after-void-new": {(409, "RESERVATION_NOT_ACTIVE")},
    # A sold reservation: its own payment again is 200, another is refunded.
    "same-payment": {(200, None)},
    "second-payment": {(409, "ALREADY_COMMITTED")},
    # A released reservation's payment is refunded.
    "after-release": {(409, "RESERVATION_NOT_ACTIVE")},
    # Only a sale can be voided; only a live hold extended.
    "void-held": {(409, "RESERVATION_NOT_ACTIVE")},
    "void-released": {(409, "RESERVATION_NOT_ACTIVE")},
    "extend-released": {(409, "RESERVATION_NOT_ACTIVE")},
    "extend-sold": {(409, "RESERVATION_NOT_ACTIVE")},
    # A voided sale voided again: 200, unchanged.
    "void-again": {(200, None)},
    # A reference no commit ever carried has no fate.
    "payment-lookup-unsent": {(404, "PAYMENT_NOT_FOUND")},
}

# The refund reasons a refused commit carries, by its error_code (a voided
# sale's own payment, voided without refund, carries none: see the checks).
REFUND_REASONS = {
    "HOLD_EXPIRED": {"HOLD_EXPIRED"},
    "RESERVATION_NOT_ACTIVE": {"RESERVATION_RELEASED", "SALE_VOIDED"},
    "ALREADY_COMMITTED": {"ALREADY_COMMITTED"},
}


class Operation:
    def __init__(self, op_id, method, template, answers):
        self.id = op_id
        self.method = method
        self.template = template
        # status -> set of error_codes (None for a success or an error
        # status whose code the document leaves open)
        self.answers: dict[int, set | None] = answers

    def documents(self, status, code) -> bool:
        if status not in self.answers:
            return False
        codes = self.answers[status]
        return codes is None or code in codes

    def earnable(self) -> set:
        """The documented (status, error_code) pairs this run's requests can earn."""
        out = set()
        for status, codes in self.answers.items():
            if status >= 500 or status == 429:
                continue  # retryable: no answer yet
            if status in UNEARNED and (self.id, status) not in EARNED_ANYWAY:
                continue
            if codes is None:
                out.add((status, None))
            else:
                out.update((status, c) for c in codes if c not in UNEARNED)
        return out


class Document:
    """openapi/holdfast.json: each operation and the answers it documents."""

    def __init__(self, path=DOCUMENT):
        with open(path) as f:
            doc = json.load(f)
        schemas = doc.get("components", {}).get("schemas", {})
        # (method, number of path segments) -> [(segments, Operation)], a
        # segment None where the template has a parameter.
        self.operations: dict[tuple[str, int], list] = {}
        for template, item in doc.get("paths", {}).items():
            segments = [None if part.startswith("{") else part
                        for part in template.strip("/").split("/")]
            for method, op in item.items():
                if not isinstance(op, dict) or "responses" not in op:
                    continue
                answers = {}
                for status, resp in op["responses"].items():
                    if status.isdigit():
                        answers[int(status)] = (self._codes(resp, schemas) if int(status) >= 400
                                             else None)
                self.operations.setdefault((method.upper(), len(segments)), []).append(
                    (segments, Operation(op.get("operationId"), method.upper(), template,
                                         answers)))
        self._seen: dict[tuple[str, str], Operation | None] = {}

    @staticmethod
    def _codes(resp, schemas):
        """The error_code values of an error answer: its problem schema, or
        the union of them discriminated by error_code."""
        codes = set()
        for content in (resp.get("content") or {}).values():
            schema = content.get("schema") or {}
            for part in schema.get("oneOf", []) + [schema]:
                if "$ref" in part:
                    part = schemas.get(part["$ref"].rsplit("/", 1)[-1], {})
                enum = ((part.get("properties") or {}).get("error_code") or {}).get("enum")
                if enum:
                    codes.update(enum)
        return codes or None

    def operation(self, method, path) -> Operation | None:
        """The operation a request reached: its method, and its path matched
        against each template, literal segments first."""
        route = path.split("?", 1)[0]
        if (method, route) in self._seen:
            return self._seen[(method, route)]
        parts = route.strip("/").split("/")
        found = None
        for segments, op in self.operations.get((method, len(parts)), []):
            if all(s is None or s == p for s, p in zip(segments, parts)):
                # A literal segment beats a parameter (/v1/events/dead).
                if found is None or segments.count(None) < found[0].count(None):
                    found = (segments, op)
        self._seen[(method, route)] = found[1] if found else None
        return self._seen[(method, route)]

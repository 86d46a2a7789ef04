"""The reservation flow through the client openapi-python-client generates
from openapi/holdfast.json.

`mypy --strict` checks every call, body and field read below against the
generated package, so a document that drifts from the wire fails there before
anything runs; running it then checks that the live service agrees.

    PYTHONPATH=generated HOLDFAST_TOKEN=hf_... python flow.py http://127.0.0.1:8080

Each response is told apart by its generated class (isinstance) and its
`error_code` enum member: no cast, no `type: ignore`.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
import uuid
from http import HTTPStatus
from typing import TypeVar, assert_never

from holdfast_client import AuthenticatedClient
from holdfast_client.api.assets import create_asset, get_asset
from holdfast_client.api.reservations import commit_reservation, get_reservation, hold_asset
from holdfast_client.api.waitlists import join_waitlist
from holdfast_client.models import (
    AlreadyCommittedProblem,
    Asset,
    AssetStatus,
    AssetUnavailableProblem,
    AssetUnavailableProblemErrorCode,
    CommitReservationRequest,
    CreateAssetRequest,
    ForbiddenProblem,
    HoldAssetRequest,
    HoldExpiredProblem,
    HoldExpiredProblemErrorCode,
    HoldLimitReachedProblem,
    HoldLimitReachedProblemErrorCode,
    IdempotencyKeyInUseProblem,
    IdempotencyKeyInUseProblemErrorCode,
    IdempotencyKeyInvalidProblem,
    IdempotencyKeyReusedProblem,
    JoinWaitlistRequest,
    MalformedJsonProblem,
    PayloadTooLargeProblem,
    PaymentAmountMismatchProblem,
    PaymentReferenceUsedProblem,
    Price,
    RateLimitedProblem,
    RefundReason,
    RequestHeadersTooLargeProblem,
    Reservation,
    ReservationNotActiveProblem,
    ReservationNotFoundProblem,
    ReservationStatus,
    SaleNotOpenProblem,
    SaleNotOpenProblemErrorCode,
    ServiceUnavailableProblem,
    ServiceUnavailableProblemErrorCode,
    UnauthenticatedProblem,
    UnsupportedMediaTypeProblem,
    ValidationFailedProblem,
    WaitlistEntry,
    WriteOutcome,
)
from holdfast_client.types import Response, Unset

T = TypeVar("T")
M = TypeVar("M")

# Every body a hold may answer 409 with. The generated hold_asset returns one
# union over all statuses, so this list is kept by hand: a 409 body the
# document adds is not seen here.
HoldConflict = AssetUnavailableProblem | SaleNotOpenProblem | HoldLimitReachedProblem | IdempotencyKeyInUseProblem

# Everything the generated commit_reservation may parse an answer into.
# commit() returns Response[CommitParsed] and Response is invariant, so an
# answer the document adds to the commit, or drops, fails mypy until this
# list matches again.
CommitParsed = (
    Reservation
    | AlreadyCommittedProblem
    | HoldExpiredProblem
    | IdempotencyKeyInUseProblem
    | PaymentAmountMismatchProblem
    | PaymentReferenceUsedProblem
    | ReservationNotActiveProblem
    | ForbiddenProblem
    | IdempotencyKeyInvalidProblem
    | MalformedJsonProblem
    | IdempotencyKeyReusedProblem
    | ValidationFailedProblem
    | PayloadTooLargeProblem
    | RateLimitedProblem
    | RequestHeadersTooLargeProblem
    | ReservationNotFoundProblem
    | ServiceUnavailableProblem
    | UnauthenticatedProblem
    | UnsupportedMediaTypeProblem
)


class FlowError(Exception):
    pass


def hold_conflict(problem: HoldConflict) -> str:
    """Every reason a hold is refused with 409, told apart by class and error_code.

    A class added to HoldConflict without its own branch fails mypy at assert_never."""
    if isinstance(problem, AssetUnavailableProblem):
        assert problem.error_code == AssetUnavailableProblemErrorCode.ASSET_UNAVAILABLE
        if problem.asset_status == AssetStatus.HELD:
            until = "?" if isinstance(problem.hold_expires_at, Unset) else problem.hold_expires_at.isoformat()
            return f"held by another buyer until {until}"
        return f"not for sale: {problem.asset_status}"
    if isinstance(problem, SaleNotOpenProblem):
        assert problem.error_code == SaleNotOpenProblemErrorCode.SALE_NOT_OPEN
        return f"the sale opens at {problem.available_from.isoformat()}"
    if isinstance(problem, HoldLimitReachedProblem):
        assert problem.error_code == HoldLimitReachedProblemErrorCode.HOLD_LIMIT_REACHED
        return "the buyer already holds as many assets as allowed"
    if isinstance(problem, IdempotencyKeyInUseProblem):
        assert problem.error_code == IdempotencyKeyInUseProblemErrorCode.IDEMPOTENCY_KEY_IN_USE
        return "an earlier attempt of this hold still runs: retry with the same Idempotency-Key"
    assert_never(problem)


def commit_unavailable(parsed: CommitParsed | None) -> str | None:
    """A commit's 503: whether the commit may have happened; None for any other answer."""
    if not isinstance(parsed, ServiceUnavailableProblem):
        return None
    assert parsed.error_code == ServiceUnavailableProblemErrorCode.SERVICE_UNAVAILABLE
    outcome = parsed.write_outcome
    if outcome == WriteOutcome.NOT_APPLIED:
        return "nothing was written: retry"
    if outcome == WriteOutcome.UNKNOWN:
        return "the commit may have happened: retry with the same Idempotency-Key to learn its answer"
    assert_never(outcome)


def describe(answer: Response[T]) -> str:
    return f"{int(answer.status_code)} {answer.content.decode('utf-8', 'replace')}"


def expect(step: str, answer: Response[T], status: HTTPStatus, model: type[M]) -> M:
    """The parsed body of `answer`, which must have `status` and parse into `model`."""
    parsed = answer.parsed
    if answer.status_code != status or not isinstance(parsed, model):
        raise FlowError(f"{step}: expected {int(status)} {model.__name__}, got {describe(answer)}")
    return parsed


def check(condition: bool, message: str) -> None:
    if not condition:
        raise FlowError(message)


def run_flow(client: AuthenticatedClient) -> str:
    run = f"{int(time.time()):x}-{uuid.uuid4().hex[:8]}"

    def key(step: str) -> str:
        return f"ci-py-{step}-{run}"

    price = Price(amount=250000, currency="EUR")

    def commit(reservation_id: str, idempotency_key: str, body: CommitReservationRequest) -> Response[CommitParsed]:
        answer = commit_reservation.sync_detailed(
            reservation_id, client=client, body=body, idempotency_key=idempotency_key
        )
        unavailable = commit_unavailable(answer.parsed)
        if unavailable is not None:
            raise FlowError(f"commit {reservation_id}: 503, {unavailable}")
        return answer

    # a. An asset with a unique id and a price.
    asset_id = f"ci-py-flow-{run}"
    created = expect(
        "create asset",
        create_asset.sync_detailed(
            client=client, body=CreateAssetRequest(id=asset_id, name="CI Python client-flow asset", price=price)
        ),
        HTTPStatus.CREATED,
        Asset,
    )
    check(created.id == asset_id and created.status == AssetStatus.AVAILABLE, f"create asset: {created.to_dict()}")
    check(created.price == price, f"create asset: price {created.price}, expected {price}")

    # b. Buyer A holds it.
    hold_body = HoldAssetRequest(buyer_id="ci-buyer-a", hold_seconds=600)
    first = hold_asset.sync_detailed(asset_id, client=client, body=hold_body, idempotency_key=key("hold-a"))
    held = expect("hold", first, HTTPStatus.CREATED, Reservation)
    check(held.status == ReservationStatus.HELD, f"hold: status {held.status}, expected HELD")
    check(held.price == price, f"hold: price {held.price}, expected {price}")
    reservation_id = held.reservation_id

    # c. The same request again: a replay, byte for byte.
    replay = hold_asset.sync_detailed(asset_id, client=client, body=hold_body, idempotency_key=key("hold-a"))
    expect("replay", replay, HTTPStatus.OK, Reservation)
    replayed = replay.headers.get("Idempotent-Replayed")
    check(replayed == "true", f"replay: Idempotent-Replayed is {replayed!r}, expected 'true'")
    check(
        replay.content == first.content,
        f"replay: body differs\n  original: {first.content!r}\n  replay:   {replay.content!r}",
    )

    # d. Buyer B meets the hold: 409, told apart by class and error_code.
    rival = hold_asset.sync_detailed(
        asset_id, client=client, body=HoldAssetRequest(buyer_id="ci-buyer-b"), idempotency_key=key("hold-b")
    )
    check(rival.status_code == HTTPStatus.CONFLICT, f"rival hold: expected 409, got {describe(rival)}")
    content_type = rival.headers.get("Content-Type", "")
    check(content_type.startswith("application/problem+json"), f"rival hold: Content-Type {content_type!r}")
    conflict = rival.parsed
    if not isinstance(conflict, AssetUnavailableProblem):
        other = hold_conflict(conflict) if isinstance(conflict, HoldConflict) else describe(rival)
        raise FlowError(f"rival hold: expected ASSET_UNAVAILABLE, got {other}")
    check(
        conflict.error_code == AssetUnavailableProblemErrorCode.ASSET_UNAVAILABLE,
        f"rival hold: error_code {conflict.error_code}, expected ASSET_UNAVAILABLE",
    )
    check(conflict.asset_status == AssetStatus.HELD, f"rival hold: asset_status {conflict.asset_status}, expected HELD")
    check(
        conflict.hold_expires_at == held.expires_at,
        f"rival hold: hold_expires_at {conflict.hold_expires_at}, expected {held.expires_at}",
    )
    rival_says = hold_conflict(conflict)

    # e. Buyer A again, with a new key: its own hold, unchanged.
    again = expect(
        "own hold",
        hold_asset.sync_detailed(
            asset_id, client=client, body=HoldAssetRequest(buyer_id="ci-buyer-a"), idempotency_key=key("hold-a-again")
        ),
        HTTPStatus.OK,
        Reservation,
    )
    check(again.reservation_id == reservation_id, f"own hold: {again.reservation_id}, expected {reservation_id}")
    check(again.expires_at == held.expires_at, f"own hold: expires_at moved to {again.expires_at}")

    # f. Buyer B queues for the asset.
    joined = expect(
        "waitlist",
        join_waitlist.sync_detailed(
            asset_id, client=client, body=JoinWaitlistRequest(buyer_id="ci-buyer-b"), idempotency_key=key("wait-b")
        ),
        HTTPStatus.CREATED,
        WaitlistEntry,
    )
    check(joined.position == 1, f"waitlist: position {joined.position}, expected 1")

    # g. The payment system commits A's hold; the asset is sold.
    payment_reference = f"pay-py-{run}"
    committed = expect(
        "commit",
        commit(reservation_id, key("commit"), CommitReservationRequest(payment_reference=payment_reference)),
        HTTPStatus.OK,
        Reservation,
    )
    check(committed.status == ReservationStatus.COMMITTED, f"commit: status {committed.status}, expected COMMITTED")
    check(committed.payment_reference == payment_reference, f"commit: payment_reference {committed.payment_reference}")
    sold = expect("read asset", get_asset.sync_detailed(asset_id, client=client), HTTPStatus.OK, Asset)
    check(sold.status == AssetStatus.SOLD, f"read asset: status {sold.status}, expected SOLD")

    # h. A payment that arrives after its hold lapsed: 409 HOLD_EXPIRED and a refund.
    late_asset_id = f"ci-py-flow-late-{run}"
    expect(
        "create late asset",
        create_asset.sync_detailed(
            client=client, body=CreateAssetRequest(id=late_asset_id, name="CI Python late commit", price=price)
        ),
        HTTPStatus.CREATED,
        Asset,
    )
    short_hold = expect(
        "short hold",
        hold_asset.sync_detailed(
            late_asset_id,
            client=client,
            body=HoldAssetRequest(buyer_id="ci-buyer-a", hold_seconds=1),
            idempotency_key=key("hold-late"),
        ),
        HTTPStatus.CREATED,
        Reservation,
    )
    late_id = short_hold.reservation_id
    deadline = time.monotonic() + 15
    while True:
        read = expect("read reservation", get_reservation.sync_detailed(late_id, client=client), HTTPStatus.OK, Reservation)
        if read.status == ReservationStatus.EXPIRED:
            break
        check(time.monotonic() < deadline, f"short hold: still {read.status} 15 s after a 1 s hold")
        time.sleep(0.1)
    late_payment = f"pay-py-late-{run}"
    late = commit(late_id, key("commit-late"), CommitReservationRequest(payment_reference=late_payment, amount=price))
    expired = expect("late commit", late, HTTPStatus.CONFLICT, HoldExpiredProblem)
    check(
        expired.error_code == HoldExpiredProblemErrorCode.HOLD_EXPIRED,
        f"late commit: error_code {expired.error_code}, expected HOLD_EXPIRED",
    )
    refund = expired.refund
    check(refund.reason == RefundReason.HOLD_EXPIRED, f"late commit: refund reason {refund.reason}, expected HOLD_EXPIRED")
    check(refund.payment_reference == late_payment, f"late commit: refund of {refund.payment_reference}")
    check(refund.reservation_id == late_id, f"late commit: refund for {refund.reservation_id}, expected {late_id}")
    check(not refund.additional_properties, f"late commit: refund has undocumented members {refund.additional_keys}")
    check(expired.reservation.status == ReservationStatus.EXPIRED, f"late commit: reservation {expired.reservation.status}")
    # A Refund has no amount member; the amount comes from the 409's reservation: its price.
    refunded = expired.reservation.price
    check(refunded == price, f"late commit: reservation price {refunded}, expected {price}")
    amount = "no price" if refunded is None else f"{refunded.amount} {refunded.currency}"

    return (
        f"{asset_id} held ({reservation_id}), replay 200 byte-identical, "
        f"rival 409 ({rival_says}), own hold 200, waitlist position 1, committed, SOLD; "
        f"late commit 409 HOLD_EXPIRED, refund {refund.refund_id} {refund.reason} {refund.status} of {amount}"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1]:
        print(f"usage: {argv[0]} BASE_URL   (e.g. {argv[0]} http://127.0.0.1:8080)", file=sys.stderr)
        return 2
    base_url = argv[1].rstrip("/")
    token = os.environ.get("HOLDFAST_TOKEN", "")
    # Every /v1 operation takes an AuthenticatedClient. Without a token (open
    # mode, where the service ignores Authorization) it sends an empty one.
    client = AuthenticatedClient(
        base_url=base_url, token=token, prefix="Bearer" if token else "", raise_on_unexpected_status=True
    )
    try:
        with client:
            summary = run_flow(client)
    except FlowError as err:
        print(f"python client flow FAILED against {base_url}: {err}", file=sys.stderr)
        return 1
    except Exception as err:
        traceback.print_exc()
        print(f"python client flow FAILED against {base_url}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print(f"python client flow OK against {base_url}: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

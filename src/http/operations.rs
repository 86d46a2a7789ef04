//! Every operation of the API, declared once. The handler's annotation holds
//! its method, path and documentation; the router names each resource after
//! its handler, and that name is the operation id looked up here for who may
//! call it, whether it takes an `Idempotency-Key`, and which problems it can
//! answer. The access guard, the OpenAPI document and the console read this
//! table; a test fails when the document and the table disagree.

use utoipa_actix_web::service_config::ServiceConfig;

use super::{assets, batch, console, events, health, payments, refunds, reservations, waitlist};
use crate::keys::Role;
use crate::reply::ErrorCode;

/// Who may call an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// No credentials: health, metrics, the document and the docs page.
    Public,
    Roles(&'static [Role]),
}

/// What a request carries besides its path and query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    None,
    /// A JSON body (maybe optional).
    Body,
    /// A JSON body and a required `Idempotency-Key`.
    KeyedBody,
    /// As `KeyedBody`, with the larger body limit of a batch.
    KeyedBatch,
}

/// One operation of the API.
#[derive(Debug)]
pub struct Operation {
    /// The operationId, which is also the handler's name.
    pub id: &'static str,
    /// Registers its handler with the router (and so with the document).
    pub register: fn(&mut ServiceConfig),
    pub rule: Rule,
    /// A page a person opens in a browser: its 401 invites HTTP Basic.
    pub page: bool,
    pub input: Input,
    /// The problems of its own, by status (those of its input, its guard and
    /// the database are added from `input`, `rule` and `database`).
    pub problems: &'static [(u16, &'static [ErrorCode])],
    /// Whether it reads or writes the database (and so can answer 503).
    pub database: bool,
}

use ErrorCode::*;
use Role::{Admin, Payments, Storefront};

const ALL: &[Role] = &[Admin, Storefront, Payments];
const ADMIN: &[Role] = &[Admin];
const SELLING: &[Role] = &[Admin, Storefront];
const PAYING: &[Role] = &[Admin, Payments];

const fn op(
    id: &'static str,
    register: fn(&mut ServiceConfig),
    rule: Rule,
    input: Input,
    problems: &'static [(u16, &'static [ErrorCode])],
) -> Operation {
    Operation {
        id,
        register,
        rule,
        page: false,
        input,
        problems,
        database: true,
    }
}

const fn page(id: &'static str, register: fn(&mut ServiceConfig)) -> Operation {
    Operation {
        id,
        register,
        rule: Rule::Roles(ADMIN),
        page: true,
        input: Input::None,
        problems: &[],
        database: false,
    }
}

/// A list: its query (filters, `limit`, `cursor`) may fail validation.
const fn list(
    id: &'static str,
    register: fn(&mut ServiceConfig),
    roles: &'static [Role],
) -> Operation {
    op(
        id,
        register,
        Roles(roles),
        NO_INPUT,
        &[(422, &[ValidationFailed])],
    )
}

const fn public(id: &'static str, register: fn(&mut ServiceConfig), database: bool) -> Operation {
    Operation {
        id,
        register,
        rule: Rule::Public,
        page: false,
        input: Input::None,
        problems: &[],
        database,
    }
}

use Input::{Body, KeyedBatch, KeyedBody};
use Rule::Roles;

const NO_INPUT: Input = Input::None;

/// The problems of a change its reservation's state may refuse: a release
/// of a hold no longer live, a void of a sale not committed.
const ACTIVE_RESERVATION: &[(u16, &[ErrorCode])] = &[
    (404, &[ReservationNotFound]),
    (409, &[ReservationNotActive]),
];

pub const OPERATIONS: &[Operation] = &[
    // The router tries them in this order: the hot paths first.
    op(
        "hold_asset",
        |c| {
            c.service(reservations::hold_asset);
        },
        Roles(SELLING),
        KeyedBody,
        &[
            (404, &[AssetNotFound]),
            (409, &[AssetUnavailable, SaleNotOpen, HoldLimitReached]),
        ],
    ),
    op(
        "commit_reservation",
        |c| {
            c.service(reservations::commit_reservation);
        },
        Roles(PAYING),
        KeyedBody,
        &[
            (404, &[ReservationNotFound]),
            (
                409,
                &[
                    HoldExpired,
                    ReservationNotActive,
                    AlreadyCommitted,
                    PaymentReferenceUsed,
                    PaymentAmountMismatch,
                ],
            ),
        ],
    ),
    op(
        "create_asset",
        |c| {
            c.service(assets::create_asset);
        },
        Roles(ADMIN),
        Body,
        &[(409, &[AssetExists])],
    ),
    op(
        "create_assets",
        |c| {
            c.service(batch::create_assets);
        },
        Roles(ADMIN),
        KeyedBatch,
        &[(409, &[AssetExists])],
    ),
    op(
        "get_asset",
        |c| {
            c.service(assets::get_asset);
        },
        Roles(ALL),
        NO_INPUT,
        &[(404, &[AssetNotFound])],
    ),
    list(
        "list_assets",
        |c| {
            c.service(assets::list_assets);
        },
        ALL,
    ),
    op(
        "update_asset",
        |c| {
            c.service(assets::update_asset);
        },
        Roles(ADMIN),
        Body,
        &[(404, &[AssetNotFound])],
    ),
    op(
        "withdraw_asset",
        |c| {
            c.service(assets::withdraw_asset);
        },
        Roles(ADMIN),
        Body,
        &[(404, &[AssetNotFound]), (409, &[AssetHeld, AssetSold])],
    ),
    op(
        "reinstate_asset",
        |c| {
            c.service(assets::reinstate_asset);
        },
        Roles(ADMIN),
        Body,
        &[(404, &[AssetNotFound])],
    ),
    op(
        "list_asset_events",
        |c| {
            c.service(assets::list_asset_events);
        },
        Roles(ALL),
        NO_INPUT,
        &[(404, &[AssetNotFound]), (422, &[ValidationFailed])],
    ),
    op(
        "count_assets",
        |c| {
            c.service(assets::count_assets);
        },
        Roles(ADMIN),
        NO_INPUT,
        &[],
    ),
    op(
        "join_waitlist",
        |c| {
            c.service(waitlist::join_waitlist);
        },
        Roles(SELLING),
        KeyedBody,
        &[
            (404, &[AssetNotFound]),
            (409, &[WaitlistNotOpen, WaitlistFull]),
        ],
    ),
    op(
        "list_waitlist",
        |c| {
            c.service(waitlist::list_waitlist);
        },
        Roles(SELLING),
        NO_INPUT,
        &[(404, &[AssetNotFound])],
    ),
    op(
        "leave_waitlist",
        |c| {
            c.service(waitlist::leave_waitlist);
        },
        Roles(SELLING),
        NO_INPUT,
        &[
            (404, &[AssetNotFound, WaitlistEntryNotFound]),
            (415, &[UnsupportedMediaType]),
            (422, &[ValidationFailed]),
        ],
    ),
    op(
        "make_offer",
        |c| {
            c.service(waitlist::make_offer);
        },
        Roles(ADMIN),
        KeyedBody,
        &[(404, &[AssetNotFound]), (409, &[AssetUnavailable])],
    ),
    op(
        "get_reservation",
        |c| {
            c.service(reservations::get_reservation);
        },
        Roles(ALL),
        NO_INPUT,
        &[(404, &[ReservationNotFound])],
    ),
    list(
        "list_reservations",
        |c| {
            c.service(reservations::list_reservations);
        },
        ALL,
    ),
    op(
        "release_reservation",
        |c| {
            c.service(reservations::release_reservation);
        },
        Roles(ALL),
        KeyedBody,
        ACTIVE_RESERVATION,
    ),
    op(
        "extend_reservation",
        |c| {
            c.service(reservations::extend_reservation);
        },
        Roles(SELLING),
        KeyedBody,
        &[
            (404, &[ReservationNotFound]),
            (409, &[ReservationNotActive, HoldExtensionLimit]),
        ],
    ),
    op(
        "void_reservation",
        |c| {
            c.service(reservations::void_reservation);
        },
        Roles(ADMIN),
        KeyedBody,
        ACTIVE_RESERVATION,
    ),
    op(
        "get_payment",
        |c| {
            c.service(payments::get_payment);
        },
        Roles(PAYING),
        NO_INPUT,
        &[(404, &[PaymentNotFound]), (422, &[ValidationFailed])],
    ),
    list(
        "list_refunds",
        |c| {
            c.service(refunds::list_refunds);
        },
        PAYING,
    ),
    op(
        "complete_refund",
        |c| {
            c.service(refunds::complete_refund);
        },
        Roles(PAYING),
        KeyedBody,
        &[(404, &[RefundNotFound])],
    ),
    list(
        "list_events",
        |c| {
            c.service(events::list_events);
        },
        ALL,
    ),
    list(
        "list_dead_events",
        |c| {
            c.service(events::list_dead_events);
        },
        ADMIN,
    ),
    op(
        "redeliver_event",
        |c| {
            c.service(events::redeliver_event);
        },
        Roles(ADMIN),
        NO_INPUT,
        // A POST: the guard refuses form encodings on every change.
        &[(404, &[EventNotFound]), (415, &[UnsupportedMediaType])],
    ),
    public(
        "get_health",
        |c| {
            c.service(health::get_health);
        },
        false,
    ),
    public(
        "get_readiness",
        |c| {
            c.service(health::get_readiness);
        },
        true,
    ),
    public(
        "get_metrics",
        |c| {
            c.service(super::get_metrics);
        },
        false,
    ),
    public(
        "get_openapi",
        |c| {
            c.service(super::get_openapi);
        },
        false,
    ),
    public(
        "get_docs",
        |c| {
            c.service(super::get_docs);
        },
        false,
    ),
    page("get_console", |c| {
        c.service(console::get_console);
    }),
    page("get_console_css", |c| {
        c.service(console::get_console_css);
    }),
    page("get_console_js", |c| {
        c.service(console::get_console_js);
    }),
];

/// The operation with this id.
pub fn find(id: &str) -> Option<&'static Operation> {
    OPERATIONS.iter().find(|op| op.id == id)
}

const BODY: &[(u16, &[ErrorCode])] = &[
    (400, &[MalformedJson]),
    (413, &[PayloadTooLarge]),
    (415, &[UnsupportedMediaType]),
    (422, &[ValidationFailed]),
];
const KEYED_BODY: &[(u16, &[ErrorCode])] = &[
    (400, &[MalformedJson, IdempotencyKeyInvalid]),
    (409, &[IdempotencyKeyInUse]),
    (413, &[PayloadTooLarge]),
    (415, &[UnsupportedMediaType]),
    (422, &[ValidationFailed, IdempotencyKeyReused]),
];
const DATABASE: &[(u16, &[ErrorCode])] = &[(503, &[ServiceUnavailable])];
/// What any request may be refused for, whatever its route.
const ANY: &[(u16, &[ErrorCode])] = &[(431, &[RequestHeadersTooLarge])];
const GUARDED: &[(u16, &[ErrorCode])] = &[
    (401, &[Unauthenticated]),
    (403, &[Forbidden]),
    (429, &[RateLimited]),
];

impl Operation {
    /// Whether it takes an `Idempotency-Key`.
    pub fn keyed(&self) -> bool {
        matches!(self.input, Input::KeyedBody | Input::KeyedBatch)
    }

    /// Every problem this operation can answer, by status, codes merged.
    pub fn all_problems(&self) -> Vec<(u16, Vec<ErrorCode>)> {
        let input = match self.input {
            Input::None => &[][..],
            Input::Body => BODY,
            Input::KeyedBody | Input::KeyedBatch => KEYED_BODY,
        };
        let guarded = match self.rule {
            Rule::Roles(_) => GUARDED,
            Rule::Public => &[],
        };
        let database = if self.database { DATABASE } else { &[] };
        let mut merged: Vec<(u16, Vec<ErrorCode>)> = Vec::new();
        for (status, codes) in self
            .problems
            .iter()
            .chain(input)
            .chain(guarded)
            .chain(database)
            .chain(ANY)
        {
            match merged.iter_mut().find(|(s, _)| s == status) {
                Some((_, all)) => {
                    for code in *codes {
                        if !all.contains(code) {
                            all.push(*code);
                        }
                    }
                }
                None => merged.push((*status, codes.to_vec())),
            }
        }
        merged.sort_by_key(|(status, _)| *status);
        merged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_codes_match_their_status() {
        for (i, op) in OPERATIONS.iter().enumerate() {
            assert!(
                OPERATIONS[..i].iter().all(|o| o.id != op.id),
                "{} twice",
                op.id
            );
            for (status, codes) in op.all_problems() {
                for code in codes {
                    assert_eq!(code.status(), status, "{} {}", op.id, code.as_str());
                }
            }
        }
    }

    /// An operation registered in `configure` without an entry here (whose
    /// document would lack its problems and roles), or an entry without an
    /// operation, fails this test.
    #[test]
    fn the_table_and_the_document_list_the_same_operations() {
        let api = crate::http::openapi();
        let mut documented: Vec<String> = api
            .paths
            .paths
            .values()
            .flat_map(crate::http::operations)
            .map(|(_, id)| id)
            .collect();
        documented.sort();
        let mut listed: Vec<String> = OPERATIONS.iter().map(|op| op.id.to_owned()).collect();
        listed.sort();
        assert_eq!(documented, listed);
    }

    #[test]
    fn keyed_operations_document_the_key_errors() {
        let hold = find("hold_asset").unwrap().all_problems();
        assert!(hold
            .iter()
            .any(|(s, c)| *s == 400 && c.contains(&IdempotencyKeyInvalid)));
        assert!(hold.iter().any(|(s, _)| *s == 503));
        assert!(find("nope").is_none());
    }
}

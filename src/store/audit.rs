//! The invariants, checked in SQL on either backend (`holdfast audit`).
//! Each check selects one text column `example` per violating row.

use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use serde::Serialize;

/// One invariant and what the database says about it.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub name: &'static str,
    pub description: &'static str,
    pub violations: i64,
    /// Up to ten violating rows.
    pub examples: Vec<String>,
    /// History from before a rule existed: listed, not a failure.
    pub history: bool,
}

pub(crate) struct Check {
    pub name: &'static str,
    pub description: &'static str,
    /// Rows written before the rule existed: listed as such, never failing.
    pub history: bool,
    /// Portable SQL; `$1` is the start of event retention (an instant).
    pub sql: &'static str,
    /// PostgreSQL's own SQL where JSON is read.
    pub postgres: Option<&'static str>,
}

/// Every fate a payment has in the money records, as `fates(scope, reference,
/// kind, reservation_id)`: each sale (kept, also when voided since), and each
/// refund except a voided sale's refund of its own payment (part of that
/// sale's fate).
macro_rules! fates {
    () => {
        "fates AS ( \
           SELECT payment_scope AS scope, payment_reference AS reference, 'kept' AS kind, \
                  id AS reservation_id \
             FROM reservations WHERE status IN ('COMMITTED', 'VOIDED') \
           UNION ALL \
           SELECT f.payment_scope, f.payment_reference, 'refunded', f.reservation_id \
             FROM refunds f JOIN reservations r ON r.id = f.reservation_id \
            WHERE NOT (f.reason = 'SALE_VOIDED' AND r.status = 'VOIDED' \
                       AND r.payment_scope = f.payment_scope AND r.payment_reference = \
                           f.payment_reference))"
    };
}

/// An event of `kind` for reservation `r`, in `e`'s data.
macro_rules! has_event {
    ($kind:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM events e WHERE e.asset_id = r.asset_id AND e.type = '",
            $kind,
            "' AND e.data LIKE '%\"reservation_id\":\"' || r.id || '\"%')"
        )
    };
}

pub(crate) const CHECKS: &[Check] = &[
    Check {
        name: "sold_has_one_commit",
        description: "Every SOLD asset has exactly one COMMITTED reservation, and it is the \
            asset's current one.",
        sql: "SELECT a.id AS example FROM assets a WHERE a.status = 'SOLD' AND ( \
                (SELECT count(*) FROM reservations r WHERE r.asset_id = a.id AND r.status = \
                    'COMMITTED') <> 1 \
                OR NOT EXISTS (SELECT 1 FROM reservations r WHERE r.id = a.current_reservation_id \
                               AND r.asset_id = a.id AND r.status = 'COMMITTED'))",
        postgres: None,
        history: false,
    },
    Check {
        name: "held_matches_its_reservation",
        description: "Every HELD asset's current reservation is HELD, for that asset, with the \
            same expiry.",
        sql: "SELECT a.id AS example FROM assets a WHERE a.status = 'HELD' AND NOT EXISTS ( \
                SELECT 1 FROM reservations r WHERE r.id = a.current_reservation_id AND \
                    r.asset_id = a.id \
                AND r.status = 'HELD' AND r.expires_at = a.hold_expires_at)",
        postgres: None,
        history: false,
    },
    Check {
        name: "one_held_reservation_per_asset",
        description: "At most one HELD reservation per asset.",
        sql: "SELECT asset_id AS example FROM reservations WHERE status = 'HELD' GROUP BY \
            asset_id HAVING count(*) > 1",
        postgres: None,
        history: false,
    },
    Check {
        name: "committed_is_sold",
        description: "Every COMMITTED reservation's asset is SOLD with it as current.",
        sql: "SELECT r.id AS example FROM reservations r WHERE r.status = 'COMMITTED' AND NOT \
            EXISTS ( \
                SELECT 1 FROM assets a WHERE a.id = r.asset_id AND a.status = 'SOLD' AND \
                    a.current_reservation_id = r.id)",
        postgres: None,
        history: false,
    },
    Check {
        name: "refused_payments_have_their_refund",
        description: "Every stored 409 that announced a refund points at that refund.",
        sql: "SELECT i.key AS example FROM idempotency_keys i \
              WHERE i.status_code = 409 AND json_extract(i.body, '$.refund.refund_id') IS NOT NULL \
              AND NOT EXISTS (SELECT 1 FROM refunds f WHERE f.id = json_extract(i.body, \
                  '$.refund.refund_id'))",
        postgres: Some(
            "SELECT i.key AS example FROM idempotency_keys i \
             WHERE i.status_code = 409 AND (i.body::jsonb -> 'refund' ->> 'refund_id') IS NOT NULL \
             AND NOT EXISTS (SELECT 1 FROM refunds f WHERE f.id = i.body::jsonb -> 'refund' ->> \
                 'refund_id')",
        ),
        history: false,
    },
    Check {
        name: "payment_has_one_fate",
        description: "Each payment reference (per payments client) bought one reservation or is \
            refunded once, never both, never twice; a voided sale's own refund is part of its \
                fate.",
        sql: concat!(
            "WITH ",
            fates!(),
            " SELECT scope || ' ' || reference AS example FROM fates WHERE scope <> '' \
              GROUP BY scope, reference HAVING count(*) > 1 \
              UNION ALL \
              SELECT DISTINCT n.scope || ' ' || n.reference FROM fates n JOIN fates o \
                ON o.reference = n.reference AND o.scope = '' WHERE n.scope <> ''"
        ),
        postgres: None,
        history: false,
    },
    Check {
        name: "payments_record_their_fate",
        description: "Every sale and every refund of a payment is its payment's recorded fate, \
            and every recorded fate is a sale or a refund.",
        sql: concat!(
            "WITH ",
            fates!(),
            " SELECT f.scope || ' ' || f.reference AS example FROM fates f WHERE f.scope <> '' \
              AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.scope = f.scope AND p.reference = \
                  f.reference \
                              AND p.reservation_id = f.reservation_id \
                              AND (p.refund_id IS NULL) = (f.kind = 'kept')) \
              UNION ALL \
              SELECT p.scope || ' ' || p.reference FROM payments p WHERE NOT EXISTS ( \
                SELECT 1 FROM fates f WHERE f.scope = p.scope AND f.reference = p.reference \
                AND f.reservation_id = p.reservation_id AND (p.refund_id IS NULL) = (f.kind = \
                    'kept'))"
        ),
        postgres: None,
        history: false,
    },
    Check {
        name: "payment_fates_before_scopes",
        description: "History: payment references kept and refunded, or refunded twice, before \
            each reference had one fate (recorded without their client). Listed for \
                reconciliation; existing refunds are left as they are.",
        sql: concat!(
            "WITH ",
            fates!(),
            " SELECT reference AS example FROM fates WHERE scope = '' \
              GROUP BY reference HAVING count(*) > 1"
        ),
        postgres: None,
        history: true,
    },
    Check {
        name: "changes_have_their_events",
        description: "Every state change and refund within the event retention has its event.",
        sql: concat!(
            "SELECT r.id AS example FROM reservations r WHERE r.created_at >= $1 AND (NOT ",
            has_event!("reservation.held"),
            " OR (r.status IN ('COMMITTED', 'VOIDED') AND NOT ",
            has_event!("reservation.committed"),
            ") OR (r.status = 'VOIDED' AND NOT ",
            has_event!("reservation.voided"),
            ") OR (r.status = 'RELEASED' AND NOT ",
            has_event!("reservation.released"),
            ") OR (r.status = 'EXPIRED' AND NOT ",
            has_event!("reservation.expired"),
            ")) UNION ALL SELECT f.id FROM refunds f WHERE f.created_at >= $1 AND NOT EXISTS ( \
               SELECT 1 FROM events e WHERE e.asset_id = f.asset_id AND e.type = \
                   'refund.requested' \
               AND e.data LIKE '%\"refund_id\":\"' || f.id || '\"%')"
        ),
        postgres: None,
        history: false,
    },
    Check {
        name: "event_sequences_have_no_gaps",
        description: "Each asset's event sequence runs without gaps or duplicates up to its last \
            number.",
        sql: "SELECT a.id AS example FROM assets a LEFT JOIN ( \
                SELECT asset_id, count(*) AS n, min(sequence) AS lo, max(sequence) AS hi FROM \
                    events GROUP BY asset_id \
              ) s ON s.asset_id = a.id \
              WHERE coalesce(s.hi, 0) <> a.last_event_sequence OR (s.n IS NOT NULL AND s.hi - \
                  s.lo + 1 <> s.n)",
        postgres: None,
        history: false,
    },
    Check {
        name: "voided_sales_are_over",
        description: "No VOIDED reservation is its asset's current one, and no payment refunded \
            for a sale still pays for it.",
        sql: "SELECT r.id AS example FROM reservations r JOIN assets a ON \
            a.current_reservation_id = r.id \
              WHERE r.status = 'VOIDED' \
              UNION ALL \
              SELECT f.id FROM refunds f WHERE f.reason = 'SALE_VOIDED' AND NOT EXISTS ( \
                SELECT 1 FROM reservations r WHERE r.id = f.reservation_id AND r.status = \
                    'VOIDED')",
        postgres: None,
        history: false,
    },
    Check {
        name: "withdrawn_assets_are_free",
        description: "A WITHDRAWN asset has no HELD reservation.",
        sql: "SELECT a.id AS example FROM assets a WHERE a.status = 'WITHDRAWN' AND EXISTS ( \
                SELECT 1 FROM reservations r WHERE r.asset_id = a.id AND r.status = 'HELD')",
        postgres: None,
        history: false,
    },
    Check {
        name: "answers_point_at_changes",
        description: "Every stored answer points at a reservation that exists and that its body \
            names.",
        sql: "SELECT i.scope || ' ' || i.key AS example FROM idempotency_keys i \
              WHERE NOT EXISTS (SELECT 1 FROM reservations r WHERE r.id = i.reservation_id) \
              OR (i.status_code IN (200, 201) AND i.body NOT LIKE '%' || i.reservation_id || '%')",
        postgres: None,
        history: false,
    },
];

/// One check in one statement: up to ten examples, each row carrying the
/// count of all violating rows. `retention` is the backend's spelling of the
/// `$1` parameter, which every check takes, used or not.
pub(crate) fn statement(check_sql: &str, retention: &str) -> String {
    format!(
        "SELECT example, count(*) OVER () AS n FROM ({check_sql}) v \
         WHERE {retention} IS NULL OR TRUE ORDER BY example LIMIT 10"
    )
}

#[derive(QueryableByName)]
pub(crate) struct Row {
    #[diesel(sql_type = Text)]
    example: String,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

pub(crate) fn finding(check: &Check, rows: Vec<Row>) -> Finding {
    Finding {
        name: check.name,
        description: check.description,
        violations: rows.first().map_or(0, |r| r.n),
        examples: rows.into_iter().map(|r| r.example).collect(),
        history: check.history,
    }
}

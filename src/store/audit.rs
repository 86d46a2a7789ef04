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
}

pub(crate) struct Check {
    pub name: &'static str,
    pub description: &'static str,
    /// Portable SQL; `$1` is the start of event retention (an instant).
    pub sql: &'static str,
    /// PostgreSQL's own SQL where JSON is read.
    pub postgres: Option<&'static str>,
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
        description: "Every SOLD asset has exactly one COMMITTED reservation, and it is the asset's current one.",
        sql: "SELECT a.id AS example FROM assets a WHERE a.status = 'SOLD' AND ( \
                (SELECT count(*) FROM reservations r WHERE r.asset_id = a.id AND r.status = 'COMMITTED') <> 1 \
                OR NOT EXISTS (SELECT 1 FROM reservations r WHERE r.id = a.current_reservation_id \
                               AND r.asset_id = a.id AND r.status = 'COMMITTED'))",
        postgres: None,
    },
    Check {
        name: "held_matches_its_reservation",
        description: "Every HELD asset's current reservation is HELD, for that asset, with the same expiry.",
        sql: "SELECT a.id AS example FROM assets a WHERE a.status = 'HELD' AND NOT EXISTS ( \
                SELECT 1 FROM reservations r WHERE r.id = a.current_reservation_id AND r.asset_id = a.id \
                AND r.status = 'HELD' AND r.expires_at = a.hold_expires_at)",
        postgres: None,
    },
    Check {
        name: "one_held_reservation_per_asset",
        description: "At most one HELD reservation per asset.",
        sql: "SELECT asset_id AS example FROM reservations WHERE status = 'HELD' GROUP BY asset_id HAVING count(*) > 1",
        postgres: None,
    },
    Check {
        name: "committed_is_sold",
        description: "Every COMMITTED reservation's asset is SOLD with it as current.",
        sql: "SELECT r.id AS example FROM reservations r WHERE r.status = 'COMMITTED' AND NOT EXISTS ( \
                SELECT 1 FROM assets a WHERE a.id = r.asset_id AND a.status = 'SOLD' AND a.current_reservation_id = r.id)",
        postgres: None,
    },
    Check {
        name: "one_refund_per_unhonoured_payment",
        description: "Each payment a reservation could not honour has exactly one refund, and no refund gives back the payment that bought the asset.",
        sql: "SELECT reservation_id || ' ' || payment_reference AS example FROM refunds \
              GROUP BY reservation_id, payment_reference HAVING count(*) <> 1 \
              UNION ALL \
              SELECT f.id FROM refunds f JOIN reservations r ON r.id = f.reservation_id \
              WHERE r.status = 'COMMITTED' AND r.payment_reference = f.payment_reference",
        postgres: None,
    },
    Check {
        name: "refused_payments_have_their_refund",
        description: "Every stored 409 that announced a refund points at that refund.",
        sql: "SELECT i.key AS example FROM idempotency_keys i \
              WHERE i.status_code = 409 AND json_extract(i.body, '$.refund.refund_id') IS NOT NULL \
              AND NOT EXISTS (SELECT 1 FROM refunds f WHERE f.id = json_extract(i.body, '$.refund.refund_id'))",
        postgres: Some(
            "SELECT i.key AS example FROM idempotency_keys i \
             WHERE i.status_code = 409 AND (i.body::jsonb -> 'refund' ->> 'refund_id') IS NOT NULL \
             AND NOT EXISTS (SELECT 1 FROM refunds f WHERE f.id = i.body::jsonb -> 'refund' ->> 'refund_id')",
        ),
    },
    Check {
        name: "payment_commits_once",
        description: "No payment_reference is on two COMMITTED or VOIDED reservations: a voided sale's payment stays used.",
        sql: "SELECT payment_reference AS example FROM reservations WHERE status IN ('COMMITTED', 'VOIDED') \
              GROUP BY payment_reference HAVING count(*) > 1",
        postgres: None,
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
               SELECT 1 FROM events e WHERE e.asset_id = f.asset_id AND e.type = 'refund.requested' \
               AND e.data LIKE '%\"refund_id\":\"' || f.id || '\"%')"
        ),
        postgres: None,
    },
    Check {
        name: "event_sequences_have_no_gaps",
        description: "Each asset's event sequence runs without gaps or duplicates up to its last number.",
        sql: "SELECT a.id AS example FROM assets a LEFT JOIN ( \
                SELECT asset_id, count(*) AS n, min(sequence) AS lo, max(sequence) AS hi FROM events GROUP BY asset_id \
              ) s ON s.asset_id = a.id \
              WHERE coalesce(s.hi, 0) <> a.last_event_sequence OR (s.n IS NOT NULL AND s.hi - s.lo + 1 <> s.n)",
        postgres: None,
    },
    Check {
        name: "voided_sales_are_over",
        description: "No VOIDED reservation is its asset's current one, and no payment refunded for a sale still pays for it.",
        sql: "SELECT r.id AS example FROM reservations r JOIN assets a ON a.current_reservation_id = r.id \
              WHERE r.status = 'VOIDED' \
              UNION ALL \
              SELECT f.id FROM refunds f WHERE f.reason = 'SALE_VOIDED' AND NOT EXISTS ( \
                SELECT 1 FROM reservations r WHERE r.id = f.reservation_id AND r.status = 'VOIDED')",
        postgres: None,
    },
    Check {
        name: "withdrawn_assets_are_free",
        description: "A WITHDRAWN asset has no HELD reservation.",
        sql: "SELECT a.id AS example FROM assets a WHERE a.status = 'WITHDRAWN' AND EXISTS ( \
                SELECT 1 FROM reservations r WHERE r.asset_id = a.id AND r.status = 'HELD')",
        postgres: None,
    },
    Check {
        name: "answers_point_at_changes",
        description: "Every stored answer points at a reservation that exists and that its body names.",
        sql: "SELECT i.scope || ' ' || i.key AS example FROM idempotency_keys i \
              WHERE NOT EXISTS (SELECT 1 FROM reservations r WHERE r.id = i.reservation_id) \
              OR (i.status_code IN (200, 201) AND i.body NOT LIKE '%' || i.reservation_id || '%')",
        postgres: None,
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
    }
}

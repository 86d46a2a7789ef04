//! Table definitions, matching `migrations/postgres`.

diesel::table! {
    assets (id) {
        id -> Text,
        name -> Text,
        status -> Text,
        hold_expires_at -> Nullable<Timestamptz>,
        current_reservation_id -> Nullable<Text>,
        version -> Int8,
        last_event_sequence -> Int8,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
    }
}

diesel::table! {
    reservations (id) {
        id -> Text,
        asset_id -> Text,
        buyer_id -> Text,
        status -> Text,
        expires_at -> Timestamptz,
        created_at -> Timestamptz,
        committed_at -> Nullable<Timestamptz>,
        released_at -> Nullable<Timestamptz>,
        payment_reference -> Nullable<Text>,
    }
}

diesel::table! {
    refunds (id) {
        id -> Text,
        reservation_id -> Text,
        asset_id -> Text,
        payment_reference -> Text,
        reason -> Text,
        status -> Text,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    events (id) {
        id -> Text,
        asset_id -> Text,
        sequence -> Int8,
        #[sql_name = "type"]
        event_type -> Text,
        data -> Text,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    idempotency_keys (scope, key) {
        scope -> Text,
        key -> Text,
        fingerprint -> Text,
        status_code -> Int4,
        body -> Text,
        location -> Nullable<Text>,
        reservation_id -> Text,
        created_at -> Timestamptz,
    }
}

diesel::joinable!(reservations -> assets (asset_id));
diesel::joinable!(refunds -> reservations (reservation_id));
diesel::joinable!(events -> assets (asset_id));

diesel::allow_tables_to_appear_in_same_query!(
    assets,
    reservations,
    refunds,
    events,
    idempotency_keys
);

//! The global event feed, and dead events for operators.

use actix_web::{get, post, web, HttpResponse};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::access::Caller;
use super::error::{respond, ApiError, ApiResult};
use super::extract::Validator;
use super::paths::EventPath;
use super::State;
use crate::domain::Event;
use crate::reply::{self, Reply};
use crate::store::{FeedCursor, FeedPage};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FeedQuery {
    /// `next_cursor` of the previous page; omit to start from the oldest event.
    pub after: Option<String>,
    /// Page size, 1 to 500 (default 100).
    #[param(value_type = Option<i64>, minimum = 1, maximum = 500)]
    pub limit: Option<String>,
}

/// One page of events, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventPage {
    pub items: Vec<Event>,
    /// Pass as `after` to continue; on the last page it stays where it is, so
    /// a poller keeps passing it and receives what comes next.
    pub next_cursor: String,
}

const LIMIT_DEFAULT: i64 = 100;

fn encode(cursor: FeedCursor) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}.{}", cursor.tx, cursor.position))
}

fn decode(text: &str) -> Result<FeedCursor, String> {
    let raw = URL_SAFE_NO_PAD
        .decode(text)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or("is not a cursor this service issued")?;
    let (tx, position) = raw
        .split_once('.')
        .ok_or("is not a cursor this service issued")?;
    match (tx.parse::<i64>(), position.parse::<i64>()) {
        (Ok(tx), Ok(position)) if tx >= 0 && position >= 0 => Ok(FeedCursor { tx, position }),
        _ => Err("is not a cursor this service issued".into()),
    }
}

/// The page of the feed (or of its dead events) that `query` asks for.
fn feed_page(query: &FeedQuery, dead: bool) -> Result<FeedPage, ApiError> {
    let mut v = Validator::default();
    let after = v
        .check("after", query.after.as_deref().map(decode).transpose())
        .flatten()
        .unwrap_or_default();
    let limit = v.limit(query.limit.as_deref(), LIMIT_DEFAULT);
    v.finish()?;
    Ok(FeedPage { after, limit, dead })
}

/// The events of a page read after `after`, and where the next one starts.
fn feed_answer(after: FeedCursor, rows: Vec<(FeedCursor, Event)>) -> HttpResponse {
    let next = rows.last().map_or(after, |(c, _)| *c);
    let items = rows.into_iter().map(|(_, e)| e).collect();
    respond(Reply::json(
        200,
        &EventPage {
            items,
            next_cursor: encode(next),
        },
    ))
}

/// Every event, oldest first, for receivers that pull or reconcile after an
/// outage. An event appears once no earlier-starting transaction can still
/// commit in front of it, so following `next_cursor` never skips one.
///
/// A storefront sees events about other clients' reservations as summaries
/// (`data` is an EventSummary), without reservation, buyer or payment.
#[utoipa::path(
    tag = "events",
    params(FeedQuery),
    responses((status = 200, description = "One page of the feed", body = EventPage))
)]
#[get("/v1/events")]
pub async fn list_events(caller: Caller, state: State, query: web::Query<FeedQuery>) -> ApiResult {
    let page = feed_page(&query, false)?;
    let client = caller.client();
    let viewer = client.own_filter();
    let rows = state.store.event_feed(page).await?;
    let rows = rows
        .into_iter()
        .map(|(cursor, event)| (cursor, event.seen_by(viewer)))
        .collect();
    Ok(feed_answer(page.after, rows))
}

/// Events whose delivery failed too often and was given up, oldest first.
#[utoipa::path(
    tag = "events",
    params(FeedQuery),
    responses((status = 200, description = "One page of dead events", body = EventPage))
)]
#[get("/v1/events/dead")]
pub async fn list_dead_events(
    _caller: Caller,
    state: State,
    query: web::Query<FeedQuery>,
) -> ApiResult {
    let page = feed_page(&query, true)?;
    Ok(feed_answer(page.after, state.store.event_feed(page).await?))
}

/// Deliver an event again (dead or not): its attempts start over.
#[utoipa::path(
    tag = "events",
    params(EventPath),
    responses((status = 202, description = "Scheduled for delivery", body = Event))
)]
#[post("/v1/events/{event_id}/redeliver")]
pub async fn redeliver_event(_caller: Caller, state: State, event: EventPath) -> ApiResult {
    match state.store.redeliver(&event.0).await? {
        Some(event) => Ok(respond(Reply::json(202, &event))),
        None => Err(reply::event_not_found().into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip() {
        let c = FeedCursor {
            tx: 812,
            position: 99,
        };
        assert_eq!(decode(&encode(c)), Ok(c));
        assert!(decode("nope").is_err());
        assert!(decode(&URL_SAFE_NO_PAD.encode("-1.2")).is_err());
    }
}

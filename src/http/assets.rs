//! Assets: create, read, list, count, timeline.

use std::collections::BTreeMap;

use actix_web::{get, patch, post, web};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::access::Caller;
use super::error::{respond, Answers, ApiError, ApiResult};
use super::extract::{cursor_of, list_page, JsonBody, PageQuery, Validator};
use super::paths::AssetPath;
use super::State;
use crate::domain::{Asset, AssetId, AssetStatus, Event, Timestamp};
use crate::reply::{self, ErrorCode, Problem, Reply};
use crate::store::{AssetPage, ReinstateOutcome, WithdrawOutcome};

/// A new asset.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateAssetRequest {
    #[schema(schema_with = AssetId::schema)]
    pub id: String,
    #[schema(schema_with = Asset::name_schema)]
    pub name: String,
    /// When the sale opens (RFC 3339); holds before it answer 409 SALE_NOT_OPEN.
    #[schema(value_type = Option<String>, format = DateTime, example = "2026-12-01T09:00:00Z")]
    #[serde(default)]
    pub available_from: Option<String>,
}

/// Changes to an asset: only when its sale opens, for now.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateAssetRequest {
    /// When the sale opens (RFC 3339), or null to open it now.
    #[schema(value_type = Option<String>, format = DateTime, example = "2026-12-01T09:00:00Z")]
    #[serde(default, deserialize_with = "present")]
    pub available_from: Option<Option<String>>,
}

/// Withdrawal takes no body, `{}`, or `{"force": true}`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WithdrawAssetRequest {
    /// Also end a live hold (its reservation becomes RELEASED).
    #[serde(default)]
    pub force: bool,
}

/// Reinstatement takes no body, or `{}`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReinstateAssetRequest {}

/// Tells a member given as null (`Some(None)`) from a missing one (`None`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

/// An RFC 3339 instant within the years 1 to 9999 once its offset is
/// applied: what both databases store and every reader formats back.
fn parse_instant(text: &str) -> Result<Timestamp, String> {
    use chrono::Datelike;
    let instant = chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|_| "must be an RFC 3339 date-time, e.g. 2026-12-01T09:00:00Z".to_owned())?;
    if !(1..=9999).contains(&instant.year()) {
        return Err(
            "must lie between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z in UTC".to_owned(),
        );
    }
    Ok(instant)
}

fn parse_name(name: &str) -> Result<String, String> {
    let n = name.chars().count();
    if n == 0 || n > Asset::NAME_MAX || name.chars().all(|c| c == ' ') {
        return Err(format!(
            "must be 1 to {} characters, not only spaces",
            Asset::NAME_MAX
        ));
    }
    if name.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(name.to_owned())
}

/// Create an asset.
#[utoipa::path(
    tag = "assets",
    request_body = CreateAssetRequest,
    responses(
        (status = 201, description = "Created", body = Asset,
         headers(("Location" = String, description = "The new asset's URL"))),
    )
)]
#[post("/v1/assets")]
pub async fn create_asset(
    _caller: Caller,
    state: State,
    body: JsonBody<CreateAssetRequest>,
) -> ApiResult {
    let mut v = Validator::default();
    let id = v.check("id", AssetId::parse(&body.value.id));
    let name = v.check("name", parse_name(&body.value.name));
    let available_from = match body.value.available_from.as_deref() {
        Some(text) => v.check("available_from", parse_instant(text)).map(Some),
        None => Some(None),
    };
    v.finish()?;
    let (Some(id), Some(name), Some(available_from)) = (id, name, available_from) else {
        return Err(ApiError::new(ErrorCode::ValidationFailed, "invalid asset"));
    };
    match state.store.create_asset(&id, &name, available_from).await? {
        Some(asset) => {
            let mut reply = Reply::json(201, &asset);
            reply.location = Some(format!("/v1/assets/{}", asset.id));
            Ok(respond(reply))
        }
        None => Err(Problem::new(
            ErrorCode::AssetExists,
            "An asset with this id already exists.",
        )
        .into()),
    }
}

/// Set or clear when an asset's sale opens.
#[utoipa::path(
    tag = "assets",
    params(AssetPath),
    request_body = UpdateAssetRequest,
    responses(
        (status = 200, description = "The asset as changed", body = Asset),
    )
)]
#[patch("/v1/assets/{asset_id}")]
pub async fn update_asset(
    _caller: Caller,
    state: State,
    asset: AssetPath,
    body: JsonBody<UpdateAssetRequest>,
) -> ApiResult {
    let id = asset.0;
    let mut v = Validator::default();
    let available_from = match &body.value.available_from {
        Some(Some(text)) => v.check("available_from", parse_instant(text)).map(Some),
        Some(None) => Some(None),
        None => v.check("available_from", Err("is the member to change".to_owned())),
    };
    v.finish()?;
    let Some(available_from) = available_from else {
        return Err(ApiError::new(
            ErrorCode::ValidationFailed,
            "nothing to change",
        ));
    };
    match state.store.set_available_from(&id, available_from).await? {
        Some(asset) => Ok(respond(Reply::json(200, &asset))),
        None => Err(reply::asset_not_found().into()),
    }
}

const WITHDRAWALS: Answers = Answers::new("holdfast_withdrawals_total", reply::asset_not_found);
const REINSTATEMENTS: Answers =
    Answers::new("holdfast_reinstatements_total", reply::asset_not_found);

/// Take an asset off sale.
///
/// An AVAILABLE asset becomes WITHDRAWN: holds answer 409 ASSET_UNAVAILABLE
/// until it is reinstated. A held asset needs `{"force": true}`, which ends
/// the hold (its reservation becomes RELEASED; a later commit is refunded).
/// Withdrawing a withdrawn asset changes nothing. Safe to retry: no key needed.
#[utoipa::path(
    tag = "assets",
    params(AssetPath),
    request_body(content = Option<WithdrawAssetRequest>, description = "Optional"),
    responses(
        (status = 200, description = "The asset, WITHDRAWN", body = Asset),
    )
)]
#[post("/v1/assets/{asset_id}/withdraw")]
pub async fn withdraw_asset(
    caller: Caller,
    state: State,
    asset: AssetPath,
    body: JsonBody<WithdrawAssetRequest, true>,
) -> ApiResult {
    let id = asset.0;
    let force = body.value.force;
    WITHDRAWALS.send(
        match state.store.withdraw(&id, force, &caller.name).await? {
            WithdrawOutcome::Withdrawn(asset) => {
                tracing::info!(asset_id = %asset.id, force, "asset withdrawn");
                ("withdrawn", Reply::json(200, &asset))
            }
            WithdrawOutcome::Unchanged(asset) => ("unchanged", Reply::json(200, &asset)),
            WithdrawOutcome::Held(asset) => ("held", reply::asset_held(&asset).into_reply()),
            WithdrawOutcome::Sold(asset) => ("sold", reply::asset_sold(&asset).into_reply()),
            WithdrawOutcome::NotFound => WITHDRAWALS.not_found(),
        },
    )
}

/// Put a withdrawn asset back on sale (AVAILABLE). Any other asset is
/// answered as it is. Safe to retry: no key needed.
#[utoipa::path(
    tag = "assets",
    params(AssetPath),
    request_body(content = Option<ReinstateAssetRequest>, description = "Optional"),
    responses(
        (status = 200, description = "The asset", body = Asset),
    )
)]
#[post("/v1/assets/{asset_id}/reinstate")]
pub async fn reinstate_asset(
    caller: Caller,
    state: State,
    asset: AssetPath,
    _body: JsonBody<ReinstateAssetRequest, true>,
) -> ApiResult {
    let id = asset.0;
    REINSTATEMENTS.send(match state.store.reinstate(&id, &caller.name).await? {
        ReinstateOutcome::Reinstated(asset) => {
            tracing::info!(asset_id = %asset.id, "asset reinstated");
            ("reinstated", Reply::json(200, &asset))
        }
        ReinstateOutcome::Unchanged(asset) => ("unchanged", Reply::json(200, &asset)),
        ReinstateOutcome::NotFound => REINSTATEMENTS.not_found(),
    })
}

/// Read an asset with its effective status.
#[utoipa::path(
    tag = "assets",
    params(AssetPath),
    responses(
        (status = 200, description = "The asset", body = Asset),
    )
)]
#[get("/v1/assets/{asset_id}")]
pub async fn get_asset(caller: Caller, state: State, asset: AssetPath) -> ApiResult {
    let id = asset.0;
    match state.store.get_asset(&id).await? {
        Some(asset) => {
            let asset = asset.seen_by(caller.owner_filter().as_deref());
            Ok(respond(Reply::json(200, &asset)))
        }
        None => Err(reply::asset_not_found().into()),
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListAssetsQuery {
    /// Only assets with this effective status.
    #[param(value_type = Option<AssetStatus>)]
    pub status: Option<String>,
    #[serde(flatten)]
    #[param(ignore)]
    pub page: PageQuery<50>,
}

list_page! {
    /// One page of assets.
    AssetList { items: Vec<Asset> }
}

/// List assets in id order, optionally by effective status (keyset paging).
#[utoipa::path(
    tag = "assets",
    params(ListAssetsQuery, PageQuery<50>),
    responses(
        (status = 200, description = "One page of assets", body = AssetList),
    )
)]
#[get("/v1/assets")]
pub async fn list_assets(
    caller: Caller,
    state: State,
    query: web::Query<ListAssetsQuery>,
) -> ApiResult {
    let mut v = Validator::default();
    let status = v.optional(
        "status",
        query.status.as_deref(),
        AssetStatus::parse_or_list,
    );
    let page = v.page(&query.page, |id| {
        AssetId::parse(id).ok().map(|_| id.to_owned())
    });
    v.finish()?;
    let items = state
        .store
        .list_assets(&AssetPage {
            status,
            after: page.after,
            limit: page.limit + 1,
        })
        .await?;
    let mut list = AssetList::page(items, page.limit, |a| cursor_of(&a.id));
    list.items = as_seen_by(&caller, list.items, Asset::seen_by);
    list.answer()
}

/// How many assets have each effective status.
#[derive(Debug, Serialize, ToSchema)]
pub struct AssetCounts {
    /// By effective status (a lapsed hold counts as AVAILABLE, as in the
    /// list); every status is present, zero included. New statuses may appear.
    #[schema(example = json!({"AVAILABLE": 12, "HELD": 3, "SOLD": 40}))]
    pub counts: BTreeMap<String, i64>,
}

/// Count assets by effective status, for an operator's overview.
#[utoipa::path(
    tag = "assets",
    responses(
        (status = 200, description = "Counts per status", body = AssetCounts),
    )
)]
#[get("/v1/asset-counts")]
pub async fn count_assets(_caller: Caller, state: State) -> ApiResult {
    let mut counts: BTreeMap<String, i64> = AssetStatus::ALL
        .iter()
        .map(|status| (status.as_str().to_owned(), 0))
        .collect();
    for (status, n) in state.store.asset_counts().await? {
        counts.insert(status.as_str().to_owned(), n);
    }
    Ok(respond(Reply::json(200, &AssetCounts { counts })))
}

list_page! {
    /// One page of an asset's events.
    EventList {
        /// Oldest first.
        items: Vec<Event>,
    }
}

/// The asset's timeline: its events, oldest first, one page at a time.
///
/// A storefront sees events about other clients' reservations as summaries
/// (`data` is an EventSummary): what happened to the asset, without the
/// reservation, buyer or payment.
#[utoipa::path(
    tag = "assets",
    params(AssetPath, PageQuery<500>),
    responses(
        (status = 200, description = "The asset's events", body = EventList),
    )
)]
#[get("/v1/assets/{asset_id}/events")]
pub async fn list_asset_events(
    caller: Caller,
    state: State,
    asset: AssetPath,
    query: web::Query<PageQuery<500>>,
) -> ApiResult {
    let mut v = Validator::default();
    let page = v.page(&query, |n| n.parse::<i64>().ok().filter(|n| *n >= 0));
    v.finish()?;
    let after = page.after.unwrap_or(0);
    let Some(items) = state
        .store
        .asset_events(&asset.0, after, page.limit + 1)
        .await?
    else {
        return Err(reply::asset_not_found().into());
    };
    let mut list = EventList::page(items, page.limit, |e| cursor_of(&e.sequence.to_string()));
    list.items = as_seen_by(&caller, list.items, Event::seen_by);
    list.answer()
}

/// The items of a page as `caller` may see them, each as `seen` shows it
/// to a viewer.
fn as_seen_by<T>(caller: &Caller, items: Vec<T>, seen: fn(T, Option<&str>) -> T) -> Vec<T> {
    let viewer = caller.owner_filter();
    items
        .into_iter()
        .map(|item| seen(item, viewer.as_deref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_stay_within_four_digit_years_in_utc() {
        assert!(parse_instant("0001-01-01T00:00:00Z").is_ok());
        assert!(parse_instant("9999-12-31T23:59:59.999999Z").is_ok());
        assert!(parse_instant("0000-12-31T23:59:59Z").is_err());
        assert!(parse_instant("9999-12-31T23:59:59-01:00").is_err());
        assert!(parse_instant("0001-01-01T00:30:00+01:00").is_err());
        assert!(parse_instant("2026-12-01 09:00").is_err());
    }

    #[test]
    fn names() {
        assert!(parse_name("Lot 7").is_ok());
        assert!(parse_name("").is_err());
        assert!(parse_name("   ").is_err());
        assert!(parse_name(&"x".repeat(256)).is_err());
    }
}

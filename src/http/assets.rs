//! Assets: create, read, list, count, timeline.

use std::collections::BTreeMap;

use actix_web::{get, patch, post, web};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::access::Caller;
use super::error::{respond, Answers, ApiError, ApiResult};
use super::extract::{cursor_of, list_page, JsonBody, PageQuery, Validator};
use super::paths::AssetPath;
use super::State;
use crate::domain::{
    attributes_from, attributes_patch_schema, attributes_schema, is_attribute_key, is_currency,
    parse_instant, Asset, AssetId, AssetStatus, AttributeValue, Attributes, Event, FieldError,
    Price,
};
use crate::reply::{self, ErrorCode, Problem, Reply};
use crate::store::{
    AssetChange, AssetPage, ChangeOutcome, NewAsset, ReinstateOutcome, WithdrawOutcome,
    EVENTS_PAGE_DEFAULT, PAGE_DEFAULT,
};

/// A new asset.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateAssetRequest {
    #[schema(schema_with = AssetId::schema)]
    pub id: String,
    #[schema(schema_with = Asset::name_schema)]
    pub name: String,
    /// What it sells for.
    pub price: Option<Price>,
    #[schema(schema_with = attributes_schema)]
    pub attributes: Option<Value>,
    /// When the sale opens (RFC 3339); holds before it answer 409 SALE_NOT_OPEN.
    #[schema(value_type = Option<String>, format = DateTime, example = "2026-12-01T09:00:00Z")]
    #[serde(default)]
    pub available_from: Option<String>,
}

/// Changes to an asset. `name`, `price` and `attributes` are catalogue
/// data: changing them bumps no version, never touches a hold, and writes
/// an `asset.updated` event; `attributes` is a JSON Merge Patch (a member
/// set to null is removed, the others set, the rest kept) and `price: null`
/// removes the price. `available_from` opens the sale later (or now, with
/// null) and is a new version of the asset.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateAssetRequest {
    #[schema(schema_with = Asset::name_schema)]
    #[serde(default, deserialize_with = "present")]
    pub name: Option<Option<String>>,
    #[schema(value_type = Option<Price>)]
    #[serde(default, deserialize_with = "present")]
    pub price: Option<Option<Price>>,
    #[schema(schema_with = attributes_patch_schema)]
    #[serde(default, deserialize_with = "present")]
    pub attributes: Option<Option<Value>>,
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
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
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

/// A new asset as given at `field` (`""` for a body of its own), checked.
pub fn new_asset(given: &CreateAssetRequest, field: &str, v: &mut Validator) -> Option<NewAsset> {
    let at = |member: &str| match field {
        "" => member.to_owned(),
        _ => format!("{field}.{member}"),
    };
    let id = v.check(&at("id"), AssetId::parse(&given.id));
    let name = v.check(&at("name"), parse_name(&given.name));
    let available_from = match given.available_from.as_deref() {
        Some(text) => v
            .check(&at("available_from"), parse_instant(text))
            .map(Some),
        None => Some(None),
    };
    if let Some(price) = &given.price {
        v.fields(|errors| price.check(&at("price"), errors));
    }
    let mut attributes = Attributes::new();
    if let Some(given) = &given.attributes {
        v.fields(|errors| {
            let found = attributes_from(given, &at("attributes"), false, errors);
            attributes = found
                .into_iter()
                .filter_map(|(key, value)| Some((key, value?)))
                .collect();
        });
    }
    Some(NewAsset {
        id: id?,
        name: name?,
        price: given.price.clone(),
        attributes,
        available_from: available_from?,
    })
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
    let asset = new_asset(&body.value, "", &mut v);
    v.finish()?;
    let Some(asset) = asset else {
        return Err(ApiError::new(ErrorCode::ValidationFailed, "invalid asset"));
    };
    match state.store.create_asset(&asset).await? {
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

/// Change an asset's name, price or attributes, or when its sale opens.
#[utoipa::path(
    tag = "assets",
    params(AssetPath),
    request_body = UpdateAssetRequest,
    responses((status = 200, description = "The asset as changed", body = Asset))
)]
#[patch("/v1/assets/{asset_id}")]
pub async fn update_asset(
    caller: Caller,
    state: State,
    asset: AssetPath,
    body: JsonBody<UpdateAssetRequest>,
) -> ApiResult {
    let id = asset.0;
    let given = &body.value;
    let mut v = Validator::default();
    let mut change = AssetChange::default();
    match &given.name {
        Some(Some(name)) => change.name = v.check("name", parse_name(name)),
        Some(None) => {
            v.check::<()>("name", Err("an asset always has a name".to_owned()));
        }
        None => {}
    }
    if let Some(price) = &given.price {
        if let Some(price) = price {
            v.fields(|errors| price.check("price", errors));
        }
        change.price = Some(price.clone());
    }
    match &given.attributes {
        Some(Some(attributes)) => v.fields(|errors| {
            change.attributes = Some(attributes_from(attributes, "attributes", true, errors));
        }),
        Some(None) => {
            v.check::<()>(
                "attributes",
                Err("must be an object; set a member to null to remove it".to_owned()),
            );
        }
        None => {}
    }
    match &given.available_from {
        Some(Some(text)) => {
            change.available_from = v.check("available_from", parse_instant(text)).map(Some)
        }
        Some(None) => change.available_from = Some(None),
        None => {}
    }
    if given.name.is_none()
        && given.price.is_none()
        && given.attributes.is_none()
        && given.available_from.is_none()
    {
        v.fields(|errors| {
            errors.push(FieldError::new(
                "body",
                "name, price, attributes or available_from is the member to change",
            ))
        });
    }
    v.finish()?;
    match state.store.update_asset(&id, &change, &caller.name).await? {
        ChangeOutcome::Changed(asset) => {
            let asset = asset.seen_by(caller.client().own_filter());
            Ok(respond(Reply::json(200, &asset)))
        }
        ChangeOutcome::TooManyAttributes(error) => {
            Err(reply::validation_failed(vec![error]).into())
        }
        ChangeOutcome::NotFound => Err(reply::asset_not_found().into()),
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
    responses((status = 200, description = "The asset, WITHDRAWN", body = Asset))
)]
#[post("/v1/assets/{asset_id}/withdraw")]
pub async fn withdraw_asset(
    caller: Caller,
    state: State,
    asset: AssetPath,
    body: JsonBody<WithdrawAssetRequest, true>,
) -> ApiResult {
    let force = body.value.force;
    WITHDRAWALS.send(
        match state.store.withdraw(&asset.0, force, &caller.name).await? {
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
    responses((status = 200, description = "The asset", body = Asset))
)]
#[post("/v1/assets/{asset_id}/reinstate")]
pub async fn reinstate_asset(
    caller: Caller,
    state: State,
    asset: AssetPath,
    _body: JsonBody<ReinstateAssetRequest, true>,
) -> ApiResult {
    REINSTATEMENTS.send(match state.store.reinstate(&asset.0, &caller.name).await? {
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
    responses((status = 200, description = "The asset", body = Asset))
)]
#[get("/v1/assets/{asset_id}")]
pub async fn get_asset(caller: Caller, state: State, asset: AssetPath) -> ApiResult {
    let id = asset.0;
    match state.store.get_asset(&id).await? {
        Some(asset) => {
            let asset = asset.seen_by(caller.client().own_filter());
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
    /// Only assets whose id starts with this (exactly, case included): the
    /// way a buyer looks for plates that start with `AB12`.
    #[param(value_type = Option<String>, pattern = "^[A-Za-z0-9._-]{1,64}$", example = "AB12")]
    pub id_prefix: Option<String>,
    /// Only assets priced at most this amount (minor units) in `currency`,
    /// which it needs.
    #[param(value_type = Option<i64>, minimum = 0, maximum = 1_000_000_000_000_000_i64)]
    pub price_max: Option<String>,
    /// The currency of `price_max`.
    #[param(value_type = Option<String>, pattern = "^[A-Z]{3}$", example = "EUR")]
    pub currency: Option<String>,
    #[serde(flatten)]
    #[param(ignore)]
    pub page: PageQuery<PAGE_DEFAULT>,
}

list_page! {
    /// One page of assets.
    AssetList { items: Vec<Asset> }
}

/// List assets in id order (the bytes of the id), by effective status,
/// id prefix, attributes and price; every filter combines with the others
/// and with keyset paging, and each is served by an index.
#[utoipa::path(
    tag = "assets",
    params(
        ListAssetsQuery,
        ("attribute" = Option<Vec<String>>, Query, explode, style = Form,
         description = "`KEY:VALUE`, repeatable; every one must match. A VALUE that reads as \
             an integer or as `true`/`false` matches only that integer or boolean, one in \
             double quotes only that string, any other VALUE that string.",
         example = json!(["region:B", "digits:4"])),
        PageQuery<PAGE_DEFAULT>
    ),
    responses((status = 200, description = "One page of assets", body = AssetList))
)]
#[get("/v1/assets")]
pub async fn list_assets(
    caller: Caller,
    state: State,
    query: web::Query<ListAssetsQuery>,
    request: actix_web::HttpRequest,
) -> ApiResult {
    let mut v = Validator::default();
    let status = v.optional(
        "status",
        query.status.as_deref(),
        AssetStatus::parse_or_list,
    );
    let id_prefix = v.optional("id_prefix", query.id_prefix.as_deref(), |p| {
        AssetId::parse(p).map(AssetId::into_inner)
    });
    let attributes: Vec<_> = form_urlencoded::parse(request.query_string().as_bytes())
        .filter(|(name, _)| name == "attribute")
        .filter_map(|(_, filter)| v.check("attribute", attribute_filter(&filter)))
        .collect();
    let price_max = match (query.price_max.as_deref(), query.currency.as_deref()) {
        (None, None) => None,
        (Some(max), Some(currency)) => {
            let amount = v.check("price_max", price_amount(max));
            let currency = v.check("currency", currency_code(currency));
            amount
                .zip(currency)
                .map(|(amount, currency)| Price { amount, currency })
        }
        (Some(_), None) => v.check("currency", Err("is required with price_max".to_owned())),
        (None, Some(_)) => v.check("price_max", Err("is required with currency".to_owned())),
    };
    let page = v.page(&query.page, |id| {
        AssetId::parse(id).ok().map(|_| id.to_owned())
    });
    v.finish()?;
    let items = state
        .store
        .list_assets(&AssetPage {
            status,
            id_prefix,
            attributes,
            price_max,
            after: page.after,
            limit: page.limit + 1,
        })
        .await?;
    let mut list = AssetList::page(items, page.limit, |a| cursor_of(&a.id));
    list.items = as_seen_by(&caller, list.items, Asset::seen_by);
    list.answer()
}

/// An `attribute` filter, `KEY:VALUE`.
fn attribute_filter(filter: &str) -> Result<(String, AttributeValue), String> {
    let (key, value) = filter
        .split_once(':')
        .ok_or_else(|| format!("{filter:?} is not KEY:VALUE"))?;
    if !is_attribute_key(key) {
        return Err(format!("{key:?} cannot name an attribute"));
    }
    Ok((key.to_owned(), AttributeValue::from_filter(value)))
}

fn price_amount(text: &str) -> Result<i64, String> {
    text.parse::<i64>()
        .ok()
        .filter(|n| (0..=Price::MAX_AMOUNT).contains(n))
        .ok_or_else(|| format!("must be an integer from 0 to {}", Price::MAX_AMOUNT))
}

fn currency_code(text: &str) -> Result<String, String> {
    match is_currency(text) {
        true => Ok(text.to_owned()),
        false => Err("must be an ISO 4217 code: three upper-case letters".to_owned()),
    }
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
    responses((status = 200, description = "Counts per status", body = AssetCounts))
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
    params(AssetPath, PageQuery<EVENTS_PAGE_DEFAULT>),
    responses((status = 200, description = "The asset's events", body = EventList))
)]
#[get("/v1/assets/{asset_id}/events")]
pub async fn list_asset_events(
    caller: Caller,
    state: State,
    asset: AssetPath,
    query: web::Query<PageQuery<EVENTS_PAGE_DEFAULT>>,
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
    let client = caller.client();
    let viewer = client.own_filter();
    items.into_iter().map(|item| seen(item, viewer)).collect()
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

//! A catalogue loaded in batches: up to 1,000 assets in one request, all
//! or none.

use actix_web::post;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::assets::{new_asset, CreateAssetRequest};
use super::error::{Answers, ApiResult};
use super::extract::{KeyedRequest, Validator};
use super::State;
use crate::domain::FieldError;
use crate::reply::{self, ErrorCode, Problem};
use crate::store::{Answer, BatchOutcome};

/// The most assets one batch may carry.
pub const BATCH_MAX: usize = 1000;

/// Assets to create together.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateAssetsRequest {
    /// 1 to 1,000 assets, each as `POST /v1/assets` takes it.
    #[schema(min_items = 1, max_items = 1000)]
    pub items: Vec<CreateAssetRequest>,
}

/// What a batch did, in item order.
#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedAssets {
    /// The ids of the assets it created.
    pub created: Vec<String>,
    /// The ids of items identical to an asset already there (name, price,
    /// attributes and sale opening): left as they were.
    pub unchanged: Vec<String>,
}

/// An item of a batch naming an asset that exists with other data.
#[derive(Debug, Serialize, ToSchema)]
pub struct AssetConflict {
    /// Its place in `items`, from 0.
    pub index: usize,
    pub id: String,
}

/// Create up to 1,000 assets at once, all or none.
///
/// Every item is checked first: any invalid one answers 422 naming each
/// fault by its path (`items[17].price.currency`), and nothing is written.
/// An item identical to an existing asset counts as unchanged; one whose id
/// exists with other data answers 409 ASSET_EXISTS with `conflicts` naming
/// every such item, and nothing is written. The body may be up to
/// HOLDFAST_MAX_BATCH_BODY_BYTES (1 MiB). With its Idempotency-Key, a retry
/// answers the same.
#[utoipa::path(
    tag = "assets",
    request_body = CreateAssetsRequest,
    responses(
        (status = 200, description = "The assets created and those already there (or a \
            replay)", body = CreatedAssets),
    )
)]
#[post("/v1/assets/batch")]
pub async fn create_assets(request: KeyedRequest<CreateAssetsRequest>, state: State) -> ApiResult {
    let items = &request.body.items;
    let mut v = Validator::default();
    if items.is_empty() || items.len() > BATCH_MAX {
        v.fields(|errors| {
            errors.push(FieldError::new(
                "items",
                format!("must hold 1 to {BATCH_MAX} assets"),
            ))
        });
    }
    let checked: Vec<_> = items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| new_asset(item, &format!("items[{i}]"), &mut v))
        .collect();
    v.finish()?;
    let outcome = state
        .store
        .create_assets(&checked, &request.idempotency)
        .await?;
    BATCHES.keyed(outcome, |done| match done {
        BatchOutcome::Created { created, unchanged } => {
            tracing::info!(
                created = created.len(),
                unchanged = unchanged.len(),
                "assets created"
            );
            let batch = Answer::Batch {
                created: &created,
                unchanged: &unchanged,
            };
            ("created", reply::answer(batch))
        }
        BatchOutcome::Conflicts(conflicts) => {
            let conflicts: Vec<AssetConflict> = conflicts
                .into_iter()
                .map(|(index, id)| AssetConflict { index, id })
                .collect();
            let problem = Problem::new(
                ErrorCode::AssetExists,
                "Some items name existing assets with other data; nothing was written.",
            )
            .with("conflicts", conflicts);
            ("conflict", problem.into_reply())
        }
    })
}

const BATCHES: Answers = Answers::new("holdfast_asset_batches_total", reply::asset_not_found);

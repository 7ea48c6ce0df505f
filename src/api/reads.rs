//! The API's reads (API.md, "Scopes and members" and "Data"): scopes,
//! members, cells by entity and key, from the node's durable state.
//!
//! Statuses and the governance replica are read under short read locks;
//! cells and the index of them by entity (`core::Cf::Items`) through the
//! store's reader on tokio's blocking pool.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{blocking, known_scope, parse_hex, put_bytes_field, query, ApiError, ApiState};
use crate::core::tables::{decode_cell_record, items_cells_prefix, items_entities_prefix};
use crate::core::Cf;
use crate::limits::{API_ENTITIES_PAGE_MAX, API_ITEMS_PAGE_DEFAULT, API_ITEMS_PAGE_MAX};
use crate::protocol::crypto::cell_path;
use crate::protocol::{Cell, GovAction, Hash, Role};

pub fn routes() -> Router<Arc<ApiState>> {
    Router::new()
        .route("/v1/scopes", get(scopes))
        .route("/v1/scopes/{scope}/members", get(members))
        .route("/v1/scopes/{scope}/entities", get(entities))
        .route("/v1/scopes/{scope}/entities/{entity}/items", get(items))
        .route("/v1/scopes/{scope}/entities/{entity}/items/{key_hex}", get(item))
}

/// API.md's name of a role.
pub fn role_name(role: Role) -> &'static str {
    match role {
        Role::Reader => "reader",
        Role::Writer => "writer",
        Role::Admin => "admin",
    }
}

/// `{"scopes": [{"scope", "name", "role"}]}`: every scope whose genesis is
/// applied here, by id, with the node's own role at its governance heads.
async fn scopes(State(state): State<Arc<ApiState>>) -> Json<Value> {
    let me = state.node.public_key;
    let held: Vec<(Hash, Option<Role>)> = {
        let st = state.node.pipeline.status.read().expect("status lock");
        st.values().map(|s| (s.scope, s.members.binary_search_by(|(m, _)| m.cmp(&me)).ok().map(|i| s.members[i].1))).collect()
    };
    let gov = state.node.pipeline.governance.read().expect("governance replica lock");
    let scopes: Vec<Value> = held
        .into_iter()
        .map(|(scope, role)| {
            // A scope's id is its genesis's, whose first action names it.
            let name = gov.get(&scope).and_then(|g| {
                g.actions.iter().find_map(|a| match a {
                    GovAction::Genesis { name, .. } => Some(name.clone()),
                    _ => None,
                })
            });
            json!({ "scope": hex::encode(scope), "name": name, "role": role.map(role_name) })
        })
        .collect();
    Json(json!({ "scopes": scopes }))
}

/// `G` at the node's current (durable) governance heads: the members sorted
/// by key, the current key's id and the keyring's ids in order.
async fn members(State(state): State<Arc<ApiState>>, Path(scope): Path<String>) -> Result<Json<Value>, ApiError> {
    let scope = known_scope(&state, &scope)?;
    let heads = {
        let st = state.node.pipeline.status.read().expect("status lock");
        st.get(&scope).map(|s| s.governance_heads.clone()).ok_or_else(|| ApiError::unknown_scope(&scope))?
    };
    let g = state.node.pipeline.governance.read().expect("governance replica lock").state_at_shared(&heads);
    let mut members: Vec<_> = g.members.iter().collect();
    members.sort_unstable_by_key(|(key, _)| **key);
    let members: Vec<Value> = members
        .into_iter()
        .map(|(key, role)| {
            json!({
                "public_key": hex::encode(key),
                // The genesis names no `kem` for its author; when that is
                // this node, its own is known.
                "kem_public_key": g.kem.get(key).or((*key == state.node.public_key).then_some(&state.node.kem_public)).map(hex::encode),
                "role": role_name(*role),
            })
        })
        .collect();
    Ok(Json(json!({
        "members": members,
        "current_key_id": g.current_key().map(hex::encode),
        "keys": g.keyring.iter().map(hex::encode).collect::<Vec<_>>(),
    })))
}

/// An item of API.md: the SPEC §8 cell of `entity` and `key`.
pub fn item_json(entity: &str, key: &[u8], cell: &Cell) -> Value {
    let mut o = Map::new();
    o.insert("entity".into(), entity.into());
    put_bytes_field(&mut o, "key", key);
    match cell.lww.as_ref().and_then(|l| l.value.as_deref()) {
        Some(value) => put_bytes_field(&mut o, "value", value),
        None => {
            o.insert("value_hex".into(), Value::Null);
        }
    }
    o.insert("deleted".into(), cell.lww.as_ref().is_some_and(|l| l.value.is_none()).into());
    o.insert("counter".into(), cell.counter.into());
    o.insert("hlc".into(), cell.lww.as_ref().map(|l| l.hlc).into());
    o.insert("author".into(), cell.lww.as_ref().map(|l| hex::encode(l.author)).into());
    Value::Object(o)
}

/// The cell of `entity` and `key` in `scope`, as stored.
fn read_cell(state: &ApiState, scope: &Hash, entity: &str, key: &[u8]) -> Result<Option<Cell>, ApiError> {
    let path = cell_path(entity, key);
    let record = state.node.reader.get(Cf::Projection, &[scope.as_slice(), path.as_slice()].concat()).map_err(store_error)?;
    Ok(record.map(|v| decode_cell_record(&v).2))
}

fn store_error(e: crate::store::StoreError) -> ApiError {
    ApiError::internal(format!("reading the store: {e}"))
}

async fn item(
    State(state): State<Arc<ApiState>>,
    Path((scope, entity, key_hex)): Path<(String, String, String)>,
) -> Result<Json<Value>, ApiError> {
    let scope = known_scope(&state, &scope)?;
    let key = parse_hex("key_hex", &key_hex)?;
    blocking(move || match read_cell(&state, &scope, &entity, &key)? {
        Some(cell) => Ok(Json(item_json(&entity, &key, &cell))),
        None => Err(ApiError::not_found(format!("no item {key_hex} in entity {entity:?}"))),
    })
    .await
}

#[derive(Deserialize)]
struct PageQuery {
    after_hex: Option<String>,
    after: Option<String>,
    limit: Option<String>,
}

/// A page's `limit`: `default` when not given, 1 to `max`; over `max` is
/// 400 (not clamped: a client asking for more than it gets would take a
/// short page for the end).
fn page_limit(limit: Option<&str>, default: usize, max: usize) -> Result<usize, ApiError> {
    let Some(text) = limit else { return Ok(default) };
    match text.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(ApiError::bad_request(format!("`limit` is a number from 1 to {max}"))),
    }
}

/// `{"items": [...], "next_after_hex"}`: the entity's cells in ascending
/// key-byte order after `after_hex`, at most `limit` (default 100, at most
/// 1000); `next_after_hex` is the last key of a full page, `null` at the
/// end.
async fn items(
    State(state): State<Arc<ApiState>>,
    Path((scope, entity)): Path<(String, String)>,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let scope = known_scope(&state, &scope)?;
    let q = query(q)?;
    let after = q.after_hex.as_deref().map(|h| parse_hex("after_hex", h)).transpose()?;
    let limit = page_limit(q.limit.as_deref(), API_ITEMS_PAGE_DEFAULT, API_ITEMS_PAGE_MAX)?;
    blocking(move || {
        let prefix = items_cells_prefix(&scope, &entity);
        let mut keys = state.node.reader.keys_after(Cf::Items, &prefix, after.as_deref(), limit + 1).map_err(store_error)?;
        let more = keys.len() > limit;
        keys.truncate(limit);
        let mut items = Vec::with_capacity(keys.len());
        for key in &keys {
            // Written in the batch of the cell's first commit.
            let cell = read_cell(&state, &scope, &entity, key)?.expect("an indexed cell is stored");
            items.push(item_json(&entity, key, &cell));
        }
        let next = if more { keys.last().map(hex::encode) } else { None };
        Ok(Json(json!({ "items": items, "next_after_hex": next })))
    })
    .await
}

/// `{"entities": [...], "next_after"}`: the entities with cells, sorted by
/// their bytes, after `after`, at most `limit` (default and most 1000; API.md
/// names no page, so a scope of fewer entities is answered whole and
/// `next_after` is `null`).
async fn entities(
    State(state): State<Arc<ApiState>>,
    Path(scope): Path<String>,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let scope = known_scope(&state, &scope)?;
    let q = query(q)?;
    let limit = page_limit(q.limit.as_deref(), API_ENTITIES_PAGE_MAX, API_ENTITIES_PAGE_MAX)?;
    blocking(move || {
        let prefix = items_entities_prefix(&scope);
        let mut names = state.node.reader.keys_after(Cf::Items, &prefix, q.after.as_ref().map(|a| a.as_bytes()), limit + 1).map_err(store_error)?;
        let more = names.len() > limit;
        names.truncate(limit);
        // Entities are strings (SPEC §4): stored as their UTF-8 bytes.
        let names: Vec<String> = names.into_iter().map(|n| String::from_utf8(n).expect("a stored entity is UTF-8")).collect();
        let next = if more { names.last().cloned() } else { None };
        Ok(Json(json!({ "entities": names, "next_after": next })))
    })
    .await
}

//! The write routes of API.md: scopes, members, keys, data ops, follow.
//! Each composes an op (or a follow) for the node's identity through
//! `node::author`, which sends it into the receive path and answers once
//! it is durable and applied; here the JSON is read and the answer written.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{post, put};
use axum::{Json, Router};
use serde_json::{json, Map, Value};

use super::{bytes_field, known_scope, parse_id, ApiError, ApiState, JsonBody};
use crate::core::DraftRefused;
use crate::node::author::{WriteError, Written};
use crate::protocol::{Action, Event, Role};

pub fn routes() -> Router<Arc<ApiState>> {
    Router::new()
        .route("/v1/scopes", post(create_scope))
        .route("/v1/scopes/{scope}/follow", post(follow))
        .route("/v1/scopes/{scope}/members", post(add_member))
        .route("/v1/scopes/{scope}/members/{public_key}", put(set_role).delete(remove_member))
        .route("/v1/scopes/{scope}/keys/rotate", post(rotate))
        .route("/v1/scopes/{scope}/ops", post(write_op))
}

type Answer = Result<(StatusCode, Json<Value>), ApiError>;

impl From<WriteError> for ApiError {
    fn from(e: WriteError) -> ApiError {
        let message = e.to_string();
        match e {
            WriteError::Refused(r) => match r {
                DraftRefused::UnknownScope => ApiError::new(StatusCode::NOT_FOUND, "unknown_scope", message),
                DraftRefused::NotAMember => ApiError::forbidden("not_a_member", message),
                DraftRefused::NotAWriter => ApiError::forbidden("not_a_writer", message),
                DraftRefused::NotAnAdmin => ApiError::forbidden("not_an_admin", message),
                DraftRefused::NoKey(_) | DraftRefused::TooManyHeads(_) | DraftRefused::Busy => ApiError::unavailable(message),
            },
            WriteError::Rejected(reason) => ApiError::rejected(reason),
            WriteError::NotFound(m) => ApiError::not_found(m),
            WriteError::Conflict(m) => ApiError::conflict(m),
            WriteError::BadRequest(m) => ApiError::bad_request(m),
            WriteError::TooLarge(m) => ApiError::too_large(m),
            WriteError::Unavailable(m) => ApiError::unavailable(m),
        }
    }
}

/// Refuses writes once the node drains (503, retryable elsewhere or later).
fn accepting(state: &ApiState) -> Result<(), ApiError> {
    if state.is_draining() {
        return Err(ApiError::unavailable("the node is draining"));
    }
    Ok(())
}

fn object<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>, ApiError> {
    v.as_object().ok_or_else(|| ApiError::bad_request(format!("{what} is a JSON object")))
}

fn string(obj: &Map<String, Value>, name: &str) -> Result<String, ApiError> {
    match obj.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(ApiError::bad_request(format!("`{name}` is a string"))),
        None => Err(ApiError::bad_request(format!("`{name}` is missing"))),
    }
}

fn role(obj: &Map<String, Value>) -> Result<Role, ApiError> {
    match string(obj, "role")?.as_str() {
        "reader" => Ok(Role::Reader),
        "writer" => Ok(Role::Writer),
        "admin" => Ok(Role::Admin),
        other => Err(ApiError::bad_request(format!("`role` is reader, writer or admin, not {other:?}"))),
    }
}

fn op_answer(status: StatusCode, w: &Written) -> (StatusCode, Json<Value>) {
    (status, Json(json!({ "op": hex::encode(w.op) })))
}

async fn create_scope(State(state): State<Arc<ApiState>>, JsonBody(body): JsonBody<Value>) -> Answer {
    accepting(&state)?;
    let name = string(object(&body, "the body")?, "name")?;
    let w = state.node.author.spawn(move |a| a.create_scope(name)).await?;
    Ok((StatusCode::CREATED, Json(json!({ "scope": hex::encode(w.scope), "op": hex::encode(w.op) }))))
}

async fn follow(State(state): State<Arc<ApiState>>, Path(scope): Path<String>) -> Answer {
    accepting(&state)?;
    // Not known yet, most often: that is the point of following it.
    let scope = parse_id("scope", &scope)?;
    state.node.author.spawn(move |a| a.follow(scope)).await?;
    Ok((StatusCode::OK, Json(json!({ "scope": hex::encode(scope), "followed": true }))))
}

async fn add_member(State(state): State<Arc<ApiState>>, Path(scope): Path<String>, JsonBody(body): JsonBody<Value>) -> Answer {
    accepting(&state)?;
    let scope = known_scope(&state, &scope)?;
    let obj = object(&body, "the body")?;
    let member = parse_id("public_key", &string(obj, "public_key")?)?;
    let kem = parse_id("kem_public_key", &string(obj, "kem_public_key")?)?;
    let role = role(obj)?;
    let w = state.node.author.spawn(move |a| a.add_member(scope, member, kem, role)).await?;
    Ok(op_answer(StatusCode::CREATED, &w))
}

async fn set_role(
    State(state): State<Arc<ApiState>>,
    Path((scope, member)): Path<(String, String)>,
    JsonBody(body): JsonBody<Value>,
) -> Answer {
    accepting(&state)?;
    let scope = known_scope(&state, &scope)?;
    let member = parse_id("public_key", &member)?;
    let role = role(object(&body, "the body")?)?;
    let w = state.node.author.spawn(move |a| a.set_role(scope, member, role)).await?;
    Ok(op_answer(StatusCode::OK, &w))
}

async fn remove_member(State(state): State<Arc<ApiState>>, Path((scope, member)): Path<(String, String)>) -> Answer {
    accepting(&state)?;
    let scope = known_scope(&state, &scope)?;
    let member = parse_id("public_key", &member)?;
    let w = state.node.author.spawn(move |a| a.remove_or_rotate(scope, Some(member))).await?;
    let key_id = w.key_id.map(hex::encode);
    Ok((StatusCode::OK, Json(json!({ "op": hex::encode(w.op), "key_id": key_id }))))
}

async fn rotate(State(state): State<Arc<ApiState>>, Path(scope): Path<String>) -> Answer {
    accepting(&state)?;
    let scope = known_scope(&state, &scope)?;
    let w = state.node.author.spawn(move |a| a.remove_or_rotate(scope, None)).await?;
    Ok((StatusCode::OK, Json(json!({ "op": hex::encode(w.op), "key_id": w.key_id.map(hex::encode) }))))
}

async fn write_op(State(state): State<Arc<ApiState>>, Path(scope): Path<String>, JsonBody(body): JsonBody<Value>) -> Answer {
    accepting(&state)?;
    let scope = known_scope(&state, &scope)?;
    let obj = object(&body, "the body")?;
    let actions = match obj.get("actions") {
        None => Vec::new(),
        Some(Value::Array(a)) => a.iter().map(action).collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::bad_request("`actions` is an array")),
    };
    let events = match obj.get("events") {
        None => Vec::new(),
        Some(Value::Array(e)) => e.iter().map(event).collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::bad_request("`events` is an array")),
    };
    if let Some(k) = obj.keys().find(|k| *k != "actions" && *k != "events") {
        return Err(ApiError::bad_request(format!("unknown field `{k}`")));
    }
    let w = state.node.author.spawn(move |a| a.write(scope, actions, events)).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "op": hex::encode(w.op), "root": w.root.map(hex::encode), "first_event_seq": w.first_event_seq })),
    ))
}

/// `{"put": {...}}`, `{"delete": {...}}` or `{"add": {...}}` (API.md, "Data").
fn action(v: &Value) -> Result<Action, ApiError> {
    let obj = object(v, "an action")?;
    let [(verb, body)] = obj.iter().collect::<Vec<_>>()[..] else {
        return Err(ApiError::bad_request("an action is one of {\"put\": …}, {\"delete\": …}, {\"add\": …}"));
    };
    let body = object(body, &format!("`{verb}`"))?;
    let entity = string(body, "entity")?;
    let key = bytes_field(body, "key")?;
    match verb.as_str() {
        "put" => Ok(Action::Put { entity, key, value: bytes_field(body, "value")? }),
        "delete" => Ok(Action::Delete { entity, key }),
        "add" => {
            let amount = body.get("amount").and_then(Value::as_i64).ok_or_else(|| ApiError::bad_request("`amount` is an integer (i64)"))?;
            Ok(Action::Add { entity, key, amount })
        }
        other => Err(ApiError::bad_request(format!("unknown action {other:?}: put, delete or add"))),
    }
}

/// `{"kind", "data"|"data_hex"}`.
fn event(v: &Value) -> Result<Event, ApiError> {
    let obj = object(v, "an event")?;
    Ok(Event { kind: string(obj, "kind")?, data: bytes_field(obj, "data")? })
}

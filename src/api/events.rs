//! The API's events (API.md, "Events"): a scope's SPEC §6.6 events as
//! Server-Sent Events, from a sequence number on, then live, each once and
//! only after durability, through the same [`Feed`] as the QUIC
//! subscription (history from the store's log, then the hub's queue).
//!
//! `GET /v1/scopes/{scope}/events?from=N`: from `N` (default 1, the whole
//! history), or from `Last-Event-ID` + 1 when that header is sent. Each
//! event: `id:` its sequence number, `event:` its kind (left out for a kind
//! holding a line break, which SSE cannot carry; `data` always has it),
//! `data:` `{"seq", "op", "kind", "data_hex", "data"?}`. The stream closes
//! when the client falls too far behind (the hub's bounded queue: the node
//! never waits for a reader) and when the node drains; the client resumes
//! from its last id.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;

use super::{known_scope, put_bytes_field, query, ApiError, ApiState};
use crate::node::feed::Feed;
use crate::protocol::node::EventFrame;

/// A comment line sent on a quiet stream this often, so that a proxy keeps
/// it open and a client gone away is noticed (its write fails) within it.
pub const EVENTS_KEEP_ALIVE_MS: u64 = 15_000;

/// The hub counts subscriptions per connection; each event stream counts
/// as a connection of its own, numbered with this bit set so that no QUIC
/// connection's id (counted up from 0) is ever one.
const STREAM_ID_BIT: u64 = 1 << 63;
static NEXT_STREAM: AtomicU64 = AtomicU64::new(0);

pub fn routes() -> Router<Arc<ApiState>> {
    Router::new().route("/v1/scopes/{scope}/events", get(events))
}

#[derive(Deserialize)]
struct EventsQuery {
    from: Option<String>,
}

/// Where a stream starts: `Last-Event-ID` + 1, else `from`, else 1.
fn first_seq(headers: &HeaderMap, from: Option<&str>) -> Result<u64, ApiError> {
    if let Some(last) = headers.get("last-event-id") {
        return last
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .and_then(|n| n.checked_add(1))
            .ok_or_else(|| ApiError::bad_request("`Last-Event-ID` is an event's sequence number"));
    }
    match from {
        None => Ok(1),
        Some(text) => text.parse::<u64>().map_err(|_| ApiError::bad_request("`from` is a sequence number")),
    }
}

async fn events(
    State(state): State<Arc<ApiState>>,
    Path(scope): Path<String>,
    headers: HeaderMap,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let scope = known_scope(&state, &scope)?;
    let from = first_seq(&headers, query(q)?.from.as_deref())?;
    let permit = state
        .event_streams
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::unavailable("the event streams are at their bound (API_EVENT_STREAMS_MAX); retry later"))?;
    let stream_id = STREAM_ID_BIT | NEXT_STREAM.fetch_add(1, Ordering::Relaxed);
    let feed = Feed::open(&state.node.hub, &state.node.reader, scope, None, stream_id, from)
        .map_err(|reason| ApiError::unavailable(format!("the node's subscriptions are at their bound ({reason}); retry later")))?;
    metrics::counter!("dagfold_api_event_streams_total").increment(1);
    let shutdown = state.shutdown.clone();
    // The feed, the drain signal and the stream's permit live as long as
    // the stream; the response's end (or the client's) drops them.
    let stream = futures_util::stream::unfold((feed, shutdown, permit), |(mut feed, mut shutdown, permit)| async move {
        let ev = tokio::select! {
            biased;
            _ = shutdown.wait_for(|draining| *draining) => return None,
            ev = feed.next() => ev?,
        };
        Some((Ok::<_, Infallible>(sse_event(&ev)), (feed, shutdown, permit)))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_millis(EVENTS_KEEP_ALIVE_MS))).into_response())
}

fn sse_event(ev: &EventFrame) -> Event {
    let mut data = serde_json::Map::new();
    data.insert("seq".into(), ev.seq.into());
    data.insert("op".into(), hex::encode(ev.op).into());
    data.insert("kind".into(), ev.kind.clone().into());
    put_bytes_field(&mut data, "data", &ev.data);
    let event = Event::default().id(ev.seq.to_string()).data(serde_json::Value::Object(data).to_string());
    if ev.kind.contains(['\n', '\r']) {
        event
    } else {
        event.event(&ev.kind)
    }
}

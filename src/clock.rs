//! The wall clock, read by the drivers (`pipeline`, `node`, `cli`); `core`
//! never reads it: every entry point there takes `now_ms`.

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

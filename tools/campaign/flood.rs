#[derive(clap::Args, Debug, Clone)]
pub struct FloodArgs {}
pub fn run(_a: &FloodArgs, _bins: &crate::proc::Bins, _work: &std::path::Path) -> Result<serde_json::Value, String> { Err("todo".into()) }

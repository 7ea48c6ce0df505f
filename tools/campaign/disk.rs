#[derive(clap::Args, Debug, Clone)]
pub struct DiskArgs {}
pub fn run(_a: &DiskArgs, _bins: &crate::proc::Bins, _work: &std::path::Path) -> Result<serde_json::Value, String> { Err("todo".into()) }

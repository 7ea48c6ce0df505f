//! The README's quick start, run exactly as printed: the shell block
//! between `<!-- quickstart -->` and `<!-- /quickstart -->`, with the
//! binaries this build made first on `PATH`, in a fresh directory. Two nodes
//! on loopback: a scope made on the first, the second added as a writer, a
//! write on the first read on the second, its events watched, a write back.

use std::process::Command;

fn quickstart_block() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README.md");
    let start = readme.find("<!-- quickstart -->").expect("the quick start's opening marker");
    let end = readme.find("<!-- /quickstart -->").expect("the quick start's closing marker");
    let section = &readme[start..end];
    let open = section.find("```sh\n").expect("a ```sh block in the quick start") + "```sh\n".len();
    let close = open + section[open..].find("```").expect("the block's end");
    section[open..close].to_owned()
}

#[test]
fn the_readme_quick_start_works_as_printed() {
    let script = quickstart_block();
    let dir = tempfile::tempdir().unwrap();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_dagfold")).parent().unwrap().to_owned();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    // Bounded: the block stops its nodes itself; this only guards a hang.
    let out = Command::new("timeout")
        .args(["120", "bash", "-euo", "pipefail", "-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the quick start failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}", out.status);
    // What the block prints: the write read on the second node, its event
    // watched there, and the write back read on the first.
    let lines: Vec<serde_json::Value> = stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let has = |f: &dyn Fn(&serde_json::Value) -> bool| lines.iter().any(f);
    assert!(has(&|v| v["value"] == "world"), "the first node's write read on the second:\n{stdout}");
    assert!(has(&|v| v["kind"] == "greeting" && v["seq"] == 1), "its event watched on the second:\n{stdout}");
    assert!(has(&|v| v["value"] == "hi back"), "the second node's write read on the first:\n{stdout}");
}

//! The power-cut filesystem (`dagfold-powercut`, tools/powercut) as a child
//! process: mounted at start, `cut` on command, unmounted on drop.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, Context};

/// A mounted power-cut filesystem.
pub struct PowerCut {
    pub mount_point: PathBuf,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl PowerCut {
    /// Mounts `backing` at `mount_point` with `bin`. Fails where FUSE is
    /// not available (no /dev/fuse, no right to mount), saying why.
    pub fn mount(bin: &Path, backing: &Path, mount_point: &Path) -> anyhow::Result<PowerCut> {
        let mut child = Command::new(bin)
            .arg(backing)
            .arg(mount_point)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawning {} (cargo build --release --manifest-path tools/powercut/Cargo.toml)", bin.display()))?;
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        if !line.contains("\"mounted\"") {
            let status = child.wait()?;
            return Err(anyhow!("the power-cut filesystem did not mount at {} ({status})", mount_point.display()));
        }
        Ok(PowerCut { mount_point: mount_point.canonicalize()?, child, stdin, stdout })
    }

    fn ask(&mut self, command: &str) -> anyhow::Result<serde_json::Value> {
        let stdin = self.stdin.as_mut().context("the power-cut filesystem is closed")?;
        writeln!(stdin, "{command}")?;
        stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        serde_json::from_str(&line).map_err(|e| anyhow!("the power-cut filesystem answered {line:?} to {command}: {e}"))
    }

    /// The power cut: every write not synced is dropped. Call it with no
    /// process using the filesystem (after the SIGKILL). Returns the
    /// filesystem's counters.
    pub fn cut(&mut self) -> anyhow::Result<serde_json::Value> {
        self.ask("cut")
    }

    /// Aims a kill: the next operation of `kind` (`commit`, `flush`,
    /// `manifest`, `recovery`) by process `pid` SIGKILLs it (see
    /// tools/powercut).
    pub fn arm(&mut self, kind: &str, pid: u32) -> anyhow::Result<()> {
        let v = self.ask(&format!("arm {kind} {pid}"))?;
        anyhow::ensure!(v.get("armed").is_some(), "the power-cut filesystem refused to arm {kind}: {v}");
        Ok(())
    }

    /// Disarms; whether the aimed kill fired.
    pub fn disarm(&mut self) -> anyhow::Result<bool> {
        Ok(self.ask("disarm")?["fired"] == true)
    }

    pub fn counters(&mut self) -> Option<serde_json::Value> {
        self.ask("counters").ok()
    }
}

impl Drop for PowerCut {
    fn drop(&mut self) {
        // End of input: it unmounts and exits; if it does not, it is killed
        // and the mount detached.
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Ok(c) = std::ffi::CString::new(self.mount_point.as_os_str().as_encoded_bytes()) {
            // SAFETY: a valid C string.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

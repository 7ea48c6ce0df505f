//! `dagfold-powercut BACKING MOUNT`: a FUSE passthrough filesystem that
//! loses unsynced writes on a simulated power cut; the crash campaign's
//! node runs its data directory on it (tools/campaign/crash.rs).
//!
//! Control on standard input, one command a line, each answered by one JSON
//! line on standard output: `cut` (the power cut; answers the counters),
//! `counters`, `arm KIND PID` and `disarm` (aimed kills, below). At start it prints `{"mounted": "MOUNT"}` once mounted; at
//! the end of its input (or `quit`) it unmounts and exits.
//!
//! What it models (the medium's assumptions, as redb's crash backend and
//! docs/RELIABILITY.md state them):
//! - **File contents are volatile until `fsync`/`fdatasync`.** Every write,
//!   and every change of size (`ftruncate`, `O_TRUNC`), is kept in memory
//!   per inode as extents over the backing file; reads see them (as the page
//!   cache would). An `fsync` of the file writes them to the backing file.
//!   [`PowerCut::cut`] drops every unsynced extent and size change: the
//!   backing directory then holds exactly what was synced.
//! - **Namespace operations are durable at once** (create, unlink, rename,
//!   mkdir; like a `dirsync` mount): a file created and written but never
//!   synced survives a cut empty (ext4's zero-length file after a crash),
//!   and a rename survives with the renamed file's synced contents only.
//!   A missing directory fsync is therefore *not* caught; a missing file
//!   fsync, or a rename over a file whose contents were not synced, is.
//! - A SIGKILL alone loses nothing (the buffers live in this process, as the
//!   page cache outlives a killed process); the campaign cuts after the node
//!   is dead (so nothing races it), as a power loss at the kill's instant.
//! - Every open is `FOPEN_DIRECT_IO` and attributes and entries are never
//!   cached by the kernel, so after a cut no reader sees a page or a size
//!   that was dropped. (No shared mmap: RocksDB does not use it by default.)
//! - `fallocate` with `FALLOC_FL_KEEP_SIZE` succeeds and does nothing;
//!   other modes, hard links and symlinks are refused (EOPNOTSUPP).
//!   Locks are the kernel's local ones (the session does not offer
//!   `FUSE_POSIX_LOCKS`).
//!
//! **Aimed kills** (`arm KIND PID`): the next operation of kind KIND made
//! by a thread of process PID SIGKILLs PID and fails with EIO without
//! taking effect, so the process dies inside that system call (a FUSE
//! request already sent is answered before the caller can die). Kinds, by
//! RocksDB's file names: `commit`, an fsync of a WAL file (`*.log`: a
//! commit being made durable); `flush`, a write to a table file (`*.sst`:
//! a flush or a compaction); `manifest`, a write to `MANIFEST-*` (a
//! version edit: a flush or compaction being installed, or the open);
//! `recovery`, a read of a WAL file (its replay at open). It fires once;
//! `disarm` answers whether it fired.
//!
//! Inode numbers are the backing files' (the backing root's is swapped
//! with 1, FUSE's root). One lock guards the state; the backing files are
//! written only at fsync, so a sync of a large file holds it for that write.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::{DirEntryExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, WriteFlags,
};

/// The kernel caches no entry and no attribute: each is asked again, so a
/// size dropped by a cut is never served from the kernel's cache.
const TTL: Duration = Duration::ZERO;

/// Unsynced changes of one inode, over its backing file.
#[derive(Default, Debug)]
struct Dirty {
    /// Written bytes by offset, non-overlapping.
    extents: BTreeMap<u64, Vec<u8>>,
    /// The file's size as its writers see it.
    size: u64,
    /// Backing bytes at or past this offset read as zeros (a truncation
    /// since the last sync, then maybe a growth).
    zero_from: Option<u64>,
}

impl Dirty {
    fn over(backing_len: u64) -> Dirty {
        Dirty { extents: BTreeMap::new(), size: backing_len, zero_from: None }
    }

    fn bytes(&self) -> u64 {
        self.extents.values().map(|v| v.len() as u64).sum()
    }

    fn write(&mut self, off: u64, data: &[u8]) {
        let end = off + data.len() as u64;
        self.size = self.size.max(end);
        if data.is_empty() {
            return;
        }
        // The common case: an append to the extent that ends here.
        let next_start = self.extents.range(off..).next().map(|(s, _)| *s);
        if let Some((&s, v)) = self.extents.range_mut(..off).next_back() {
            if s + v.len() as u64 == off && next_start.is_none_or(|n| n >= end) {
                v.extend_from_slice(data);
                return;
            }
        }
        let overlapping: Vec<u64> =
            self.extents.range(..end).rev().take_while(|(s, v)| **s + v.len() as u64 > off).map(|(s, _)| *s).collect();
        for s in overlapping {
            let v = self.extents.remove(&s).expect("listed just above");
            let e = s + v.len() as u64;
            if s < off {
                self.extents.insert(s, v[..(off - s) as usize].to_vec());
            }
            if e > end {
                self.extents.insert(end, v[(end - s) as usize..].to_vec());
            }
        }
        self.extents.insert(off, data.to_vec());
    }

    fn truncate(&mut self, size: u64) {
        if size < self.size {
            self.zero_from = Some(self.zero_from.map_or(size, |z| z.min(size)));
            let cut: Vec<u64> = self.extents.range(..).filter(|(s, v)| **s + v.len() as u64 > size).map(|(s, _)| *s).collect();
            for s in cut {
                let mut v = self.extents.remove(&s).expect("listed just above");
                if s < size {
                    v.truncate((size - s) as usize);
                    self.extents.insert(s, v);
                }
            }
        }
        self.size = size;
    }

    /// `len` bytes at `off` as a reader sees them: the backing file's,
    /// zeros past a truncation, the extents over them.
    fn read(&self, file: &File, off: u64, len: u64) -> std::io::Result<Vec<u8>> {
        let end = (off + len).min(self.size);
        if off >= end {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; (end - off) as usize];
        let base_end = end.min(self.zero_from.unwrap_or(u64::MAX));
        if base_end > off {
            let mut got = 0usize;
            let want = (base_end - off) as usize;
            while got < want {
                let n = file.read_at(&mut buf[got..want], off + got as u64)?;
                if n == 0 {
                    break;
                }
                got += n;
            }
        }
        for (&s, v) in self.extents.range(..end) {
            let e = s + v.len() as u64;
            if e <= off {
                continue;
            }
            let (from, to) = (s.max(off), e.min(end));
            buf[(from - off) as usize..(to - off) as usize].copy_from_slice(&v[(from - s) as usize..(to - s) as usize]);
        }
        Ok(buf)
    }

    /// Makes the backing file what a reader sees.
    fn sync_to(&self, file: &File) -> std::io::Result<()> {
        if let Some(z) = self.zero_from {
            if z < file.metadata()?.len() {
                file.set_len(z)?;
            }
        }
        for (&s, v) in &self.extents {
            file.write_all_at(v, s)?;
        }
        file.set_len(self.size)
    }
}

/// What the filesystem did, for the campaign's report.
#[derive(Default, Debug, Clone, Copy)]
struct Counters {
    writes: u64,
    fsyncs: u64,
    synced_bytes: u64,
    cuts: u64,
    /// Unsynced bytes dropped by the cuts, and the files they touched.
    dropped_bytes: u64,
    dropped_files: u64,
}

impl Counters {
    fn json(&self) -> String {
        format!(
            "{{\"writes\": {}, \"fsyncs\": {}, \"synced_bytes\": {}, \"cuts\": {}, \"dropped_bytes\": {}, \"dropped_files\": {}}}",
            self.writes, self.fsyncs, self.synced_bytes, self.cuts, self.dropped_bytes, self.dropped_files
        )
    }
}

/// What an aimed kill waits for (see the module's doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Aim {
    Commit,
    Flush,
    Manifest,
    Recovery,
}

/// The operation a file system request is, for [`Aim`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
    Fsync,
}

impl Aim {
    fn parse(s: &str) -> Option<Aim> {
        match s {
            "commit" => Some(Aim::Commit),
            "flush" => Some(Aim::Flush),
            "manifest" => Some(Aim::Manifest),
            "recovery" => Some(Aim::Recovery),
            _ => None,
        }
    }

    fn matches(self, op: Op, name: &str) -> bool {
        match self {
            Aim::Commit => op == Op::Fsync && name.ends_with(".log"),
            Aim::Flush => op == Op::Write && name.ends_with(".sst"),
            Aim::Manifest => op == Op::Write && name.starts_with("MANIFEST-"),
            Aim::Recovery => op == Op::Read && name.ends_with(".log"),
        }
    }
}

/// The process `tid` (a thread id, as FUSE gives it) belongs to.
fn tgid_of(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Tgid:"))?.trim().parse().ok()
}

struct State {
    /// An armed aimed kill: what, of which process, and whether it fired.
    aim: Option<(Aim, u32)>,
    fired: bool,
    backing: PathBuf,
    backing_root_ino: u64,
    /// Inode → path below the backing root (the last name it was seen by).
    paths: HashMap<u64, PathBuf>,
    handles: HashMap<u64, (u64, File)>,
    next_fh: u64,
    dirty: HashMap<u64, Dirty>,
    counters: Counters,
}

impl State {
    fn ino_of(&self, backing_ino: u64) -> u64 {
        if backing_ino == self.backing_root_ino {
            1
        } else if backing_ino == 1 {
            self.backing_root_ino
        } else {
            backing_ino
        }
    }

    fn full(&self, ino: u64) -> Result<PathBuf, Errno> {
        self.paths.get(&ino).map(|p| self.backing.join(p)).ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<(PathBuf, PathBuf), Errno> {
        let rel = self.paths.get(&parent.0).ok_or(Errno::ENOENT)?.join(name);
        Ok((self.backing.join(&rel), rel))
    }

    fn attr(&self, ino: u64, md: &std::fs::Metadata) -> FileAttr {
        let ft = md.file_type();
        let kind = if ft.is_dir() { FileType::Directory } else if ft.is_symlink() { FileType::Symlink } else { FileType::RegularFile };
        let size = self.dirty.get(&ino).map_or(md.len(), |d| d.size);
        let t = |s: i64, ns: i64| UNIX_EPOCH + Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32);
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: t(md.atime(), md.atime_nsec()),
            mtime: t(md.mtime(), md.mtime_nsec()),
            ctime: t(md.ctime(), md.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind,
            perm: (md.mode() & 0o7777) as u16,
            nlink: md.nlink() as u32,
            uid: md.uid(),
            gid: md.gid(),
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Looks `rel` up in the backing directory and remembers its inode.
    fn enter(&mut self, rel: PathBuf) -> Result<FileAttr, Errno> {
        let md = std::fs::symlink_metadata(self.backing.join(&rel)).map_err(Errno::from)?;
        let ino = self.ino_of(md.ino());
        self.paths.insert(ino, rel);
        Ok(self.attr(ino, &md))
    }

    fn stat(&self, ino: u64) -> Result<FileAttr, Errno> {
        let md = match self.handles.values().find(|(i, _)| *i == ino) {
            Some((_, f)) => f.metadata(),
            None => std::fs::symlink_metadata(self.full(ino)?),
        }
        .map_err(Errno::from)?;
        Ok(self.attr(ino, &md))
    }

    fn open_handle(&mut self, ino: u64, path: &Path) -> Result<u64, Errno> {
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path).map_err(Errno::from)?;
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, (ino, file));
        Ok(fh)
    }

    /// Fires an armed aimed kill if `op` on `ino` by `tid` is its target:
    /// SIGKILLs the process and returns EIO for the request (no effect).
    fn aimed(&mut self, op: Op, ino: u64, tid: u32) -> Result<(), Errno> {
        let Some((aim, pid)) = self.aim else { return Ok(()) };
        let name = self.paths.get(&ino).and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if !aim.matches(op, &name) || (tid != pid && tgid_of(tid) != Some(pid)) {
            return Ok(());
        }
        // SAFETY: a signal to a process id.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        self.aim = None;
        self.fired = true;
        Err(Errno::EIO)
    }

    fn dirty_of(&mut self, ino: u64) -> Result<&mut Dirty, Errno> {
        if !self.dirty.contains_key(&ino) {
            let len = self.stat(ino)?.size;
            self.dirty.insert(ino, Dirty::over(len));
        }
        Ok(self.dirty.get_mut(&ino).expect("inserted just above"))
    }

    fn forget_path(&mut self, full: &Path) {
        let Ok(rel) = full.strip_prefix(&self.backing) else { return };
        let rel = rel.to_path_buf();
        let gone: Vec<u64> = self.paths.iter().filter(|(_, p)| **p == rel).map(|(i, _)| *i).collect();
        for ino in gone {
            self.paths.remove(&ino);
            if !self.handles.values().any(|(i, _)| *i == ino) {
                self.dirty.remove(&ino);
            }
        }
    }
}

/// The filesystem (given to fuser) and its control handle share the state.
#[derive(Clone)]
struct PowerCut {
    state: Arc<Mutex<State>>,
}

impl PowerCut {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Mounts `backing` at `mount_point` (both created if missing). Fails
    /// where FUSE is not available (no /dev/fuse, no permission to mount).
    fn mount(backing: &Path, mount_point: &Path) -> std::io::Result<(PowerCut, fuser::BackgroundSession)> {
        std::fs::create_dir_all(backing)?;
        std::fs::create_dir_all(mount_point)?;
        let backing = backing.canonicalize()?;
        let mount_point = mount_point.canonicalize()?;
        let root_ino = std::fs::metadata(&backing)?.ino();
        let mut paths = HashMap::new();
        paths.insert(1, PathBuf::new());
        let fs = PowerCut {
            state: Arc::new(Mutex::new(State {
                aim: None,
                fired: false,
                backing: backing.clone(),
                backing_root_ino: root_ino,
                paths,
                handles: HashMap::new(),
                next_fh: 1,
                dirty: HashMap::new(),
                counters: Counters::default(),
            })),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![fuser::MountOption::FSName("dagfold-powercut".into()), fuser::MountOption::NoAtime];
        // Two request threads: a sync's write to the backing file then does
        // not stop every read (the state's lock is held briefly otherwise).
        config.n_threads = Some(2);
        config.clone_fd = true;
        let session = fuser::spawn_mount(fs.clone(), &mount_point, &config)?;
        Ok((fs, session))
    }

    /// The power cut: every write and size change not synced is dropped.
    /// Call it with no process using the filesystem (after the SIGKILL).
    fn cut(&self) -> Counters {
        let mut s = self.lock();
        let dirty = std::mem::take(&mut s.dirty);
        s.counters.cuts += 1;
        s.counters.dropped_files += dirty.len() as u64;
        s.counters.dropped_bytes += dirty.values().map(Dirty::bytes).sum::<u64>();
        s.counters
    }

    fn counters(&self) -> Counters {
        self.lock().counters
    }

    fn arm(&self, aim: Aim, pid: u32) {
        let mut s = self.lock();
        s.aim = Some((aim, pid));
        s.fired = false;
    }

    /// Disarms; whether the aimed kill fired.
    fn disarm(&self) -> bool {
        let mut s = self.lock();
        s.aim = None;
        std::mem::take(&mut s.fired)
    }

    /// unlink or rmdir (`remove`), durable at once; an unlinked file's
    /// unsynced data goes with its name unless a handle is still open.
    fn remove(&self, parent: INodeNo, name: &OsStr, remove: fn(&Path) -> std::io::Result<()>, reply: ReplyEmpty) {
        let mut s = self.lock();
        let r = s.child(parent, name).and_then(|(full, _)| {
            remove(&full).map_err(Errno::from)?;
            s.forget_path(&full);
            Ok(())
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

impl fuser::Filesystem for PowerCut {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut s = self.lock();
        match s.child(parent, name).and_then(|(_, rel)| s.enter(rel)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.lock().stat(ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut s = self.lock();
        let r = (|| {
            if let Some(mode) = mode {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(s.full(ino.0)?, std::fs::Permissions::from_mode(mode & 0o7777)).map_err(Errno::from)?;
            }
            if let Some(size) = size {
                // A change of size is data: volatile until the next fsync.
                s.dirty_of(ino.0)?.truncate(size);
            }
            s.stat(ino.0)
        })();
        match r {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let mut s = self.lock();
        let r = s.child(parent, name).and_then(|(full, rel)| {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().mode(mode & !umask & 0o7777).create(&full).map_err(Errno::from)?;
            s.enter(rel)
        });
        match r {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, |p| std::fs::remove_file(p), reply)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, |p| std::fs::remove_dir(p), reply)
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut s = self.lock();
        let r = (|| {
            if !flags.is_empty() {
                return Err(Errno::EINVAL);
            }
            let (from, from_rel) = s.child(parent, name)?;
            let (to, to_rel) = s.child(newparent, newname)?;
            let moved = std::fs::symlink_metadata(&from).map_err(Errno::from)?;
            // The file replaced, if any, is gone (with its unsynced data).
            if std::fs::symlink_metadata(&to).is_ok_and(|m| m.ino() != moved.ino()) {
                s.forget_path(&to);
            }
            std::fs::rename(&from, &to).map_err(Errno::from)?;
            // The moved inode, and what is below it for a directory.
            let renamed: Vec<(u64, PathBuf)> = s
                .paths
                .iter()
                .filter_map(|(i, p)| p.strip_prefix(&from_rel).ok().map(|rest| (*i, if rest.as_os_str().is_empty() { to_rel.clone() } else { to_rel.join(rest) })))
                .collect();
            for (i, p) in renamed {
                s.paths.insert(i, p);
            }
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut s = self.lock();
        let r = (|| {
            let path = s.full(ino.0)?;
            let fh = s.open_handle(ino.0, &path)?;
            if flags.0 & libc::O_TRUNC != 0 {
                s.dirty_of(ino.0)?.truncate(0);
            }
            Ok(fh)
        })();
        match r {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn create(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        let mut s = self.lock();
        let r = (|| {
            let (full, rel) = s.child(parent, name)?;
            let mut o = std::fs::OpenOptions::new();
            o.read(true).write(true).mode(mode & !umask & 0o7777);
            if flags & libc::O_EXCL != 0 {
                o.create_new(true);
            } else {
                o.create(true);
            }
            // The file exists from here (namespace operations are durable).
            drop(o.open(&full).map_err(Errno::from)?);
            let attr = s.enter(rel)?;
            let fh = s.open_handle(attr.ino.0, &full)?;
            if flags & libc::O_TRUNC != 0 {
                s.dirty_of(attr.ino.0)?.truncate(0);
            }
            Ok((s.stat(attr.ino.0)?, fh))
        })();
        match r {
            Ok((attr, fh)) => reply.created(&TTL, &attr, Generation(0), FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let mut s = self.lock();
        let r = (|| {
            s.aimed(Op::Read, ino.0, req.pid())?;
            let (_, file) = s.handles.get(&fh.0).ok_or(Errno::EBADF)?;
            match s.dirty.get(&ino.0) {
                Some(d) => d.read(file, offset, size as u64).map_err(Errno::from),
                None => {
                    let mut buf = vec![0u8; size as usize];
                    let mut got = 0usize;
                    while got < buf.len() {
                        let n = file.read_at(&mut buf[got..], offset + got as u64).map_err(Errno::from)?;
                        if n == 0 {
                            break;
                        }
                        got += n;
                    }
                    buf.truncate(got);
                    Ok(buf)
                }
            }
        })();
        match r {
            Ok(buf) => reply.data(&buf),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut s = self.lock();
        match s.aimed(Op::Write, ino.0, req.pid()).and_then(|()| s.dirty_of(ino.0)) {
            Ok(d) => {
                d.write(offset, data);
                s.counters.writes += 1;
                reply.written(data.len() as u32)
            }
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: fuser::LockOwner, reply: ReplyEmpty) {
        // close(2) makes nothing durable.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut s = self.lock();
        s.handles.remove(&fh.0);
        // An unlinked file's data goes with its last handle.
        if !s.paths.contains_key(&ino.0) && !s.handles.values().any(|(i, _)| *i == ino.0) {
            s.dirty.remove(&ino.0);
        }
        reply.ok();
    }

    fn fsync(&self, req: &Request, ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let mut s = self.lock();
        let r = (|| {
            s.aimed(Op::Fsync, ino.0, req.pid())?;
            let Some(d) = s.dirty.remove(&ino.0) else { return Ok(()) };
            let (_, file) = s.handles.get(&fh.0).ok_or(Errno::EBADF)?;
            // The backing file never loses power: written, not synced.
            if let Err(e) = d.sync_to(file) {
                s.dirty.insert(ino.0, d);
                return Err(Errno::from(e));
            }
            s.counters.fsyncs += 1;
            s.counters.synced_bytes += d.bytes();
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let s = self.lock();
        let r = (|| {
            let dir = s.full(ino.0)?;
            let mut entries = vec![(ino.0, FileType::Directory, std::ffi::OsString::from(".")), (1, FileType::Directory, "..".into())];
            for e in std::fs::read_dir(&dir).map_err(Errno::from)? {
                let e = e.map_err(Errno::from)?;
                let ft = e.file_type().map_err(Errno::from)?;
                let kind = if ft.is_dir() { FileType::Directory } else if ft.is_symlink() { FileType::Symlink } else { FileType::RegularFile };
                entries.push((s.ino_of(e.ino()), kind, e.file_name()));
            }
            Ok(entries)
        })();
        match r {
            Ok(entries) => {
                for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // Namespace operations are durable at once (see the module's doc).
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let backing = self.lock().backing.clone();
        let Ok(c) = std::ffi::CString::new(backing.as_os_str().as_encoded_bytes()) else { return reply.error(Errno::EINVAL) };
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid C string and a zeroed out-parameter.
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return reply.error(Errno::from(std::io::Error::last_os_error()));
        }
        reply.statfs(st.f_blocks, st.f_bfree, st.f_bavail, st.f_files, st.f_ffree, st.f_bsize as u32, st.f_namemax as u32, st.f_frsize as u32);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fallocate(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _offset: u64, _length: u64, mode: i32, reply: ReplyEmpty) {
        if mode == libc::FALLOC_FL_KEEP_SIZE {
            reply.ok()
        } else {
            reply.error(Errno::EOPNOTSUPP)
        }
    }
}

fn main() -> std::process::ExitCode {
    use std::io::{BufRead, Write};
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let [backing, mount_point] = args.as_slice() else {
        eprintln!("usage: dagfold-powercut BACKING_DIR MOUNT_POINT (commands on stdin: cut, counters, quit)");
        return std::process::ExitCode::from(2);
    };
    let (fs, session) = match PowerCut::mount(Path::new(backing), Path::new(mount_point)) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("dagfold-powercut: mounting {} at {}: {e}", Path::new(backing).display(), Path::new(mount_point).display());
            return std::process::ExitCode::from(1);
        }
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{{\"mounted\": {:?}}}", Path::new(mount_point).display().to_string());
    let _ = out.flush();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let answer = match line.trim() {
            "cut" => fs.cut().json(),
            "counters" => fs.counters().json(),
            "disarm" => format!("{{\"fired\": {}}}", fs.disarm()),
            cmd if cmd.starts_with("arm ") => {
                let mut w = cmd.split_whitespace().skip(1);
                match (w.next().and_then(Aim::parse), w.next().and_then(|p| p.parse::<u32>().ok())) {
                    (Some(aim), Some(pid)) => {
                        fs.arm(aim, pid);
                        format!("{{\"armed\": \"{aim:?}\"}}")
                    }
                    _ => format!("{{\"error\": {cmd:?}}}"),
                }
            }
            "quit" => break,
            other => format!("{{\"error\": {other:?}}}"),
        };
        if writeln!(out, "{answer}").and_then(|()| out.flush()).is_err() {
            break;
        }
    }
    match session.umount_and_join() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dagfold-powercut: unmounting: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Dirty, PowerCut};
    use std::io::Write;
    use std::path::Path;

    #[test]
    fn a_cut_drops_what_was_not_synced() {
        // SAFETY: no arguments, no side effects.
        if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
            eprintln!("SKIPPED a_cut_drops_what_was_not_synced: it mounts, which needs /dev/fuse and root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (backing, mnt) = (dir.path().join("backing"), dir.path().join("mnt"));
        let (fs, session) = PowerCut::mount(&backing, &mnt).unwrap();
        let mut f = std::fs::File::create(mnt.join("synced")).unwrap();
        f.write_all(b"kept").unwrap();
        f.sync_data().unwrap();
        f.write_all(b" lost").unwrap();
        drop(f);
        std::fs::write(mnt.join("unsynced"), b"lost").unwrap();
        let mut t = std::fs::File::create(mnt.join("tmp")).unwrap();
        t.write_all(b"renamed").unwrap();
        t.sync_all().unwrap();
        drop(t);
        std::fs::rename(mnt.join("tmp"), mnt.join("CURRENT")).unwrap();
        assert_eq!(std::fs::read(mnt.join("synced")).unwrap(), b"kept lost", "reads see unsynced writes");
        assert_eq!(std::fs::read(backing.join("synced")).unwrap(), b"kept");
        let c = fs.cut();
        assert_eq!((c.cuts, c.dropped_files, c.dropped_bytes), (1, 2, 9));
        assert_eq!(std::fs::read(mnt.join("synced")).unwrap(), b"kept");
        assert_eq!(std::fs::read(mnt.join("unsynced")).unwrap(), b"", "created (durable at once), never synced");
        assert_eq!(std::fs::read(mnt.join("CURRENT")).unwrap(), b"renamed");
        session.umount_and_join().unwrap();
    }

    #[test]
    fn extents_overlay_the_backing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let mut d = Dirty::over(10);
        d.write(2, b"ab");
        d.write(10, b"XY");
        d.write(12, b"Z");
        d.write(3, b"cde");
        assert_eq!(d.read(&file, 0, 100).unwrap(), b"01acde6789XYZ");
        d.truncate(4);
        d.write(6, b"q");
        assert_eq!(d.read(&file, 0, 100).unwrap(), b"01ac\0\0q");
        d.sync_to(&file).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"01ac\0\0q");
    }
}

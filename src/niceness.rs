//! Thread priorities: the node lowers some of its threads' (the verifiers',
//! RocksDB's flush threads') so that the orderer, projector and committer
//! keep the cores when they are contended.

/// Raises thread `tid`'s niceness to `nice` (Linux: niceness is per thread),
/// never lowering it: raising one's own niceness needs no privilege. False
/// when it could not be set; the thread then runs as before.
#[cfg(target_os = "linux")]
pub fn lower_thread(tid: libc::id_t, nice: i32) -> bool {
    // SAFETY: getpriority/setpriority of one thread id of this process have
    // no memory effects.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) >= nice || libc::setpriority(libc::PRIO_PROCESS, tid, nice) == 0 }
}

/// `lower_thread` for the calling thread.
pub fn lower_this_thread(nice: i32) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no preconditions.
        lower_thread(unsafe { libc::gettid() } as libc::id_t, nice)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = nice;
        false
    }
}

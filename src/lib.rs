//! Support for the workspace-level tests and benchmarks: checks written once against
//! `&dyn Backend`, run on the CPU emulator by `tests/` and on a GPU by the GPU bundle.
pub mod call_check;
pub mod channels;
pub mod checks;
pub mod hooked;
pub mod msccl_programs;
pub mod net_check;
pub mod onesided_check;
pub mod p2p_check;
pub mod procs;
pub mod reduce_copy_check;
pub mod reference;
pub mod ring_check;
pub mod tree_check;

/// The project's shared folder (fixtures, seeds): `../shared` beside the repository, or
/// `RSCCL_SHARED` for a checkout elsewhere (CI clones into a temporary directory).
pub fn shared_dir() -> std::path::PathBuf {
    match std::env::var_os("RSCCL_SHARED") {
        Some(d) if !d.is_empty() => d.into(),
        _ => std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"),
    }
}

/// Runs `f(rank, comm)` for every communicator of `comms` at once, a thread each (ranks of one
/// process meet only if all run together); the results in rank order. A panic in one is
/// re-raised here.
pub fn on_each_rank<T: Send>(
    comms: &[rsccl::comm::Comm],
    f: impl Fn(usize, &rsccl::comm::Comm) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms.iter().enumerate().map(|(r, c)| s.spawn(move || f(r, c))).collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    })
}

/// The test kernels' modules (self-tests, reduce-copy kernels): built by `cargo xtask build-ptx`
/// into `host/ptx/test/` beside the library's, but not embedded in the library.
pub mod test_kernels {
    use rsccl::ptx::Module;
    include!("../host/ptx/test/modules.rs");

    /// Makes the test kernels loadable by the GPU backend (the library's are always there).
    pub fn register() {
        rsccl::ptx::register_modules("sm_90", SM_90);
        rsccl::ptx::register_modules("sm_80", SM_80);
    }
}

//! Compiles the kernel crate beside this one (`../kernel`, package rsccl-embed-kernel) to PTX for
//! sm_90 and sm_80 with rsccl-build: one module per kernel with its launch bound, assembled by
//! ptxas and held to rsccl's resource audit, written to `$OUT_DIR/rsccl-kernels/` with the index
//! `modules.rs` that main.rs includes. It runs again only when the kernels' sources (or the
//! device crate's) change.
use rsccl_build::{Arch, Builder};

fn main() {
    // ptxas is required here (a user's build may leave it optional): this example is where CI
    // checks that a user's kernels assemble and pass the audit.
    let built = Builder::new("../kernel").archs(&[Arch::Sm90, Arch::Sm80]).require_ptxas(true).build_script();
    if let Err(e) = built {
        eprintln!("error: building the kernels of ../kernel: {e}");
        std::process::exit(1);
    }
}

//! The shared library's name as loaders look it up (NCCL's SONAME) and its exports: `nccl*` and
//! `pnccl*` only (the version script).
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/libnccl.map");
    println!("cargo:rerun-if-changed=libnccl.map");
}

//! Benchmark placeholder; replaced by the owning module.
fn main() {}

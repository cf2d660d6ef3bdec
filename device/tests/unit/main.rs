//! The device crate's own tests, as one integration test of its public API rather than unit
//! tests: a unit-test build compiles the whole crate (every kernel of every type) a second time,
//! which cost CI over seven minutes; this binary links the library built once.
mod dtype;
mod group;
mod kernels;
mod ll;
mod multicast;
mod multimem;
mod pack;
mod redop;
mod reduce_copy;
mod soft;

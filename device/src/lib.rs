//! rsccl device primitives. One source for the GPU (nvptx64, `no_std`) and the host (emulated).
#![cfg_attr(target_arch = "nvptx64", no_std)]

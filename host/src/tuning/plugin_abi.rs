//! The C ABI of NCCL tuner plugins (`src/include/plugin/tuner/tuner_v2.h` … `tuner_v6.h`):
//! the tables a plugin exports, the constants it may rewrite and the numbers the cost table
//! is indexed by. Only layouts here; [`super::plugin`] loads and drives them.
use crate::transport::net::plugin_abi::Logger;
use std::ffi::{c_char, c_int, c_void};

/// `ncclResult_t` of a call that succeeded.
pub const NCCL_SUCCESS: c_int = 0;

/// A cost-table entry NCCL leaves out (`NCCL_ALGO_PROTO_IGNORE`): the plugin may not pick it.
pub const IGNORE: f32 = -1.0;

/// Algorithms of a cost table (`NCCL_NUM_ALGORITHMS`), in [`super::Algo`]'s order.
pub const NUM_ALGORITHMS: usize = 7;
/// Protocols of a cost table (`NCCL_NUM_PROTOCOLS`), in [`super::Proto`]'s order.
pub const NUM_PROTOCOLS: usize = 3;

/// The cost table `getCollInfo` reads and lowers: predicted µs per algorithm × protocol,
/// [`IGNORE`] where the call cannot run. NCCL passes it as `float**` though it is this
/// contiguous array (plugins cast it back to `float (*)[NCCL_NUM_PROTOCOLS]`).
pub type CostTable = [[f32; NUM_PROTOCOLS]; NUM_ALGORITHMS];

/// `ncclNvlDomainInfo_v5_t` (the same in v6).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvlDomainInfo {
    /// NVLink domains (here: hosts).
    pub n_nvl_domains: c_int,
    /// Fewest ranks of a domain.
    pub min_ranks_per_nvl_domain: c_int,
    /// Most ranks of a domain.
    pub max_ranks_per_nvl_domain: c_int,
}

/// `ncclTunerConstants_v5_t` (the same in v6): the model's constants a v5/v6 plugin's `init`
/// may rewrite before the cost table is built. `[link][algo][proto]` for the hardware
/// latencies (NVLink, PCI, NET); `[generation][nodes class]` for the caps.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ConstantsV5 {
    /// `baseLatencies`, µs.
    pub base_latencies: [[f64; NUM_PROTOCOLS]; NUM_ALGORITHMS],
    /// `hwLatencies`, µs.
    pub hw_latencies: [[[f64; NUM_PROTOCOLS]; NUM_ALGORITHMS]; 3],
    /// `llMaxBws`, GB/s.
    pub ll_max_bws: [[f64; 3]; 4],
    /// `perChMaxRingLL128Bws`, GB/s.
    pub per_ch_max_ring_ll128_bws: [[f64; 3]; 4],
    /// `perChMaxTreeLL128Bws`, GB/s.
    pub per_ch_max_tree_ll128_bws: [[f64; 3]; 4],
    /// `perChMaxTreeBws`, GB/s.
    pub per_ch_max_tree_bws: [[f64; 3]; 4],
    /// `perChMaxNVLSTreeBws`, GB/s.
    pub per_ch_max_nvls_tree_bws: [[f64; 3]; 4],
}

/// `getCollInfo` of v3: no `regBuff`.
pub type GetCollInfoV3 =
    unsafe extern "C" fn(*mut c_void, c_int, usize, c_int, *mut *mut f32, c_int, c_int, *mut c_int) -> c_int;
/// `getCollInfo` of v4 to v6.
pub type GetCollInfoV4 = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    usize,
    c_int,
    *mut *mut f32,
    c_int,
    c_int,
    c_int,
    *mut c_int,
) -> c_int;
/// `getCollInfo` of v2: the plugin names an algorithm and protocol (`collNetSupport`,
/// `nvlsSupport` in, `algorithm`, `protocol`, `nChannels` out).
pub type GetCollInfoV2 = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    usize,
    c_int,
    c_int,
    c_int,
    *mut c_int,
    *mut c_int,
    *mut c_int,
) -> c_int;
/// `init` of v2 to v4: `(nRanks, nNodes, logFunction, &context)`.
pub type InitV2 = unsafe extern "C" fn(usize, usize, Logger, *mut *mut c_void) -> c_int;
/// `init` of v5 and v6: `(&context, commId, nRanks, nNodes, logFunction, nvlDomainInfo,
/// constants)`.
pub type InitV5 = unsafe extern "C" fn(
    *mut *mut c_void,
    u64,
    usize,
    usize,
    Logger,
    *mut NvlDomainInfo,
    *mut ConstantsV5,
) -> c_int;
/// `destroy` (v2 to v4) and `finalize` (v5, v6).
pub type Finalize = unsafe extern "C" fn(*mut c_void) -> c_int;

/// `ncclTuner_v2_t`.
#[repr(C)]
pub struct TunerV2 {
    /// The plugin's name.
    pub name: *const c_char,
    /// Per communicator.
    pub init: Option<InitV2>,
    /// Per call.
    pub get_coll_info: Option<GetCollInfoV2>,
    /// Per communicator, at its end.
    pub destroy: Option<Finalize>,
}

/// `ncclTuner_v3_t`.
#[repr(C)]
pub struct TunerV3 {
    /// The plugin's name.
    pub name: *const c_char,
    /// Per communicator.
    pub init: Option<InitV2>,
    /// Per call.
    pub get_coll_info: Option<GetCollInfoV3>,
    /// Per communicator, at its end.
    pub destroy: Option<Finalize>,
}

/// `ncclTuner_v4_t`.
#[repr(C)]
pub struct TunerV4 {
    /// The plugin's name.
    pub name: *const c_char,
    /// Per communicator.
    pub init: Option<InitV2>,
    /// Per call.
    pub get_coll_info: Option<GetCollInfoV4>,
    /// Per communicator, at its end.
    pub destroy: Option<Finalize>,
}

/// `ncclTuner_v5_t`, and the first four entries of `ncclTuner_v6_t` (whose fifth,
/// `getChunkSize`, may be NULL and is not called: rsccl's chunk sizes are the FIFOs').
#[repr(C)]
pub struct TunerV5 {
    /// The plugin's name.
    pub name: *const c_char,
    /// Per communicator; may rewrite the constants.
    pub init: Option<InitV5>,
    /// Per call.
    pub get_coll_info: Option<GetCollInfoV4>,
    /// Per communicator, at its end.
    pub finalize: Option<Finalize>,
}

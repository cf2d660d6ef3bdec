//! NCCL's C types as this library defines them: one definition each, from which both the
//! exported functions' Rust signatures and the generated `nccl.h` come (so enum values and
//! struct layouts cannot drift between the two).
//!
//! Values a caller passes in (`ncclDataType_t`, `ncclRedOp_t`, …) are plain `int`s here and
//! checked by the call: a Rust enum holding an out-of-range value from C would be undefined
//! behaviour.
use std::ffi::{c_char, c_int, c_uint, c_void};

/// The NCCL API level this library implements: 2.28.0 (the code PyTorch and nccl-tests read
/// to switch features on: PreMulSum ≥ 2.11, bf16 ≥ 2.10, config ≥ 2.17, split ≥ 2.18,
/// `ncclMemAlloc` ≥ 2.19, fp8 ≥ 2.24).
pub const NCCL_MAJOR: c_int = 2;
/// See [`NCCL_MAJOR`].
pub const NCCL_MINOR: c_int = 28;
/// See [`NCCL_MAJOR`].
pub const NCCL_PATCH: c_int = 0;

/// NCCL's version code: `X*1000 + Y*100 + Z` up to 2.8, `X*10000 + Y*100 + Z` after.
///
/// ```
/// assert_eq!(nccl::abi::version_code(2, 8, 4), 2804);
/// assert_eq!(nccl::abi::version_code(2, 28, 0), 22800);
/// ```
pub const fn version_code(x: c_int, y: c_int, z: c_int) -> c_int {
    if x <= 2 && y <= 8 {
        x * 1000 + y * 100 + z
    } else {
        x * 10000 + y * 100 + z
    }
}

/// This library's [`version_code`].
pub const NCCL_VERSION_CODE: c_int = version_code(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);

/// `ncclResult_t`.
pub type NcclResult = c_int;

/// The `ncclResult_t` values, in order (value = index): the list the plugin ABI names them by.
pub const RESULTS: [&str; 9] = rsccl::transport::net::plugin_abi::RESULTS;
/// `ncclSuccess`.
pub const SUCCESS: NcclResult = 0;
/// `ncclUnhandledCudaError`.
pub const UNHANDLED_CUDA_ERROR: NcclResult = 1;
/// `ncclSystemError`.
pub const SYSTEM_ERROR: NcclResult = 2;
/// `ncclInternalError`.
pub const INTERNAL_ERROR: NcclResult = 3;
/// `ncclInvalidArgument`.
pub const INVALID_ARGUMENT: NcclResult = 4;
/// `ncclInvalidUsage`.
pub const INVALID_USAGE: NcclResult = 5;
/// `ncclRemoteError`.
pub const REMOTE_ERROR: NcclResult = 6;
/// `ncclInProgress`.
pub const IN_PROGRESS: NcclResult = 7;
/// `ncclTimeout`.
pub const TIMEOUT: NcclResult = 8;

/// `ncclDataType_t` names and values (aliases share a value), in the header's order.
pub const DATA_TYPES: [(&str, c_int); 20] = [
    ("ncclInt8", 0),
    ("ncclChar", 0),
    ("ncclUint8", 1),
    ("ncclInt32", 2),
    ("ncclInt", 2),
    ("ncclUint32", 3),
    ("ncclInt64", 4),
    ("ncclUint64", 5),
    ("ncclFloat16", 6),
    ("ncclHalf", 6),
    ("ncclFloat32", 7),
    ("ncclFloat", 7),
    ("ncclFloat64", 8),
    ("ncclDouble", 8),
    ("ncclBfloat16", 9),
    ("ncclFloat8e4m3", 10),
    ("ncclFloat8e5m2", 11),
    ("ncclNumTypes", 12),
    ("ncclFloat8E4M3", 10),
    ("ncclFloat8E5M2", 11),
];

/// `ncclRedOp_t` names and values: the five built-in ops, then `ncclNumOps`; dynamic ops
/// ([`ncclRedOpCreatePreMulSum`](crate::ncclRedOpCreatePreMulSum)) are numbered from it.
pub const RED_OPS: [(&str, c_int); 7] = [
    ("ncclSum", 0),
    ("ncclProd", 1),
    ("ncclMax", 2),
    ("ncclMin", 3),
    ("ncclAvg", 4),
    ("ncclNumOps", 5),
    ("ncclMaxRedOp", 0x7fff_ffff),
];
/// `ncclNumOps`: the first dynamic op's value.
pub const NUM_OPS: c_int = 5;

/// `ncclScalarResidence_t` names and values.
pub const SCALAR_RESIDENCE: [(&str, c_int); 2] = [("ncclScalarDevice", 0), ("ncclScalarHostImmediate", 1)];

/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;
/// `NCCL_API_MAGIC`: the `magic` of a config a caller initialised.
pub const API_MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT`: a config field left to the library.
pub const CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `NCCL_SPLIT_NOCOLOR`.
pub const SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_SHRINK_DEFAULT`: shrink, waiting for a call of the parent in flight.
pub const SHRINK_DEFAULT: c_int = 0;
/// `NCCL_SHRINK_ABORT`: stop the parent's call in flight first.
pub const SHRINK_ABORT: c_int = 1;
/// `NCCL_WIN_DEFAULT`: a window registration without symmetric collectives.
pub const WIN_DEFAULT: c_int = 0;
/// `NCCL_WIN_COLL_SYMMETRIC`: a window collectives may run on symmetrically (every rank's
/// buffer of one size, the same offsets).
pub const WIN_COLL_SYMMETRIC: c_int = 1;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId {
    /// rsccl's unique id bytes ([`rsccl::UniqueId::to_bytes`]).
    pub internal: [c_char; UNIQUE_ID_BYTES],
}

/// `ncclComm_t`: a pointer to this library's communicator handle.
pub type NcclComm = *mut crate::handle::CommHandle;

/// `cudaStream_t` as C passes it (any value on the CPU emulator, NULL included).
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct CudaStream(pub *mut c_void);

/// `ncclWindow_t`: a registered window ([`crate::ncclCommWindowRegister`]), opaque to C.
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct NcclWindow(pub *mut c_void);

/// `ncclDevCommRequirements_t`, only ever behind a pointer here.
pub enum DevCommRequirements {}

/// `ncclDevComm_t`, only ever behind a pointer here.
pub enum DevComm {}

/// An `ncclResult_t` a call writes through a pointer (`ncclCommGetAsyncError`).
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct ResultOut(pub c_int);

/// `ncclDataType_t` as passed (checked by each call).
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct NcclDataType(pub c_int);

/// `ncclRedOp_t` as passed (checked by each call).
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct NcclRedOp(pub c_int);

/// `ncclScalarResidence_t` as passed.
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct NcclScalarResidence(pub c_int);

/// `ncclConfig_t` up to the fields of NCCL 2.28 this library reads. A caller's config is read
/// by its `size` and `version` as NCCL does: fields past its size, or newer than its version,
/// take their defaults.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclConfig {
    /// `sizeof(ncclConfig_t)` as the caller was compiled.
    pub size: usize,
    /// [`API_MAGIC`].
    pub magic: c_uint,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// 0: nonblocking init, split and group end (`ncclInProgress`, polled).
    pub blocking: c_int,
    /// Not used by rsccl.
    pub cga_cluster_size: c_int,
    /// Lower bound on channels (blocks).
    pub min_ctas: c_int,
    /// Upper bound on channels (blocks).
    pub max_ctas: c_int,
    /// Not used by rsccl.
    pub net_name: *const c_char,
    /// Not used by rsccl.
    pub split_share: c_int,
    /// Not used by rsccl.
    pub traffic_class: c_int,
    /// A name for logs.
    pub comm_name: *const c_char,
    /// Not used by rsccl.
    pub collnet_enable: c_int,
    /// Not used by rsccl.
    pub cta_policy: c_int,
    /// Not used by rsccl.
    pub shrink_share: c_int,
    /// Not used by rsccl.
    pub nvls_ctas: c_int,
}

/// Each [`NcclConfig`] field's C declaration, in order (the header's struct).
pub const CONFIG_FIELDS: [&str; 15] = [
    "size_t size",
    "unsigned int magic",
    "unsigned int version",
    "int blocking",
    "int cgaClusterSize",
    "int minCTAs",
    "int maxCTAs",
    "const char* netName",
    "int splitShare",
    "int trafficClass",
    "const char* commName",
    "int collnetEnable",
    "int CTAPolicy",
    "int shrinkShare",
    "int nvlsCTAs",
];

impl Default for NcclConfig {
    /// `NCCL_CONFIG_INITIALIZER`.
    fn default() -> Self {
        let u = CONFIG_UNDEF_INT;
        NcclConfig {
            size: std::mem::size_of::<NcclConfig>(),
            magic: API_MAGIC,
            version: NCCL_VERSION_CODE as c_uint,
            blocking: u,
            cga_cluster_size: u,
            min_ctas: u,
            max_ctas: u,
            net_name: std::ptr::null(),
            split_share: u,
            traffic_class: u,
            comm_name: std::ptr::null(),
            collnet_enable: u,
            cta_policy: u,
            shrink_share: u,
            nvls_ctas: u,
        }
    }
}

/// `ncclSimInfo_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclSimInfo {
    /// `sizeof(ncclSimInfo_t)`.
    pub size: usize,
    /// `0x74685283`.
    pub magic: c_uint,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// The estimate, in microseconds.
    pub estimated_time: f32,
}

/// The C spelling of a parameter type of an exported function (the header's prototypes come
/// from the functions' Rust parameter types through this).
pub trait CType {
    /// Its C type.
    const C: &'static str;
}

macro_rules! c_types {
    ($($t:ty => $c:literal),* $(,)?) => { $(impl CType for $t { const C: &'static str = $c; })* };
}
c_types!(
    c_int => "int",
    usize => "size_t",
    *const c_void => "const void*",
    *mut c_void => "void*",
    *mut *mut c_void => "void**",
    *mut c_int => "int*",
    *const c_int => "const int*",
    NcclComm => "ncclComm_t",
    *mut NcclComm => "ncclComm_t*",
    NcclUniqueId => "ncclUniqueId",
    *mut NcclUniqueId => "ncclUniqueId*",
    CudaStream => "cudaStream_t",
    NcclDataType => "ncclDataType_t",
    NcclRedOp => "ncclRedOp_t",
    *mut NcclRedOp => "ncclRedOp_t*",
    NcclScalarResidence => "ncclScalarResidence_t",
    *mut NcclConfig => "ncclConfig_t*",
    *mut NcclSimInfo => "ncclSimInfo_t*",
    *mut ResultOut => "ncclResult_t*",
    NcclWindow => "ncclWindow_t",
    *mut NcclWindow => "ncclWindow_t*",
    *const DevCommRequirements => "const ncclDevCommRequirements_t*",
    *mut DevComm => "ncclDevComm_t*",
    *const DevComm => "const ncclDevComm_t*",
);

/// An exported function as the header declares it.
#[derive(Clone, Copy, Debug)]
pub struct Prototype {
    /// C return type.
    pub ret: &'static str,
    /// Its name (the `pnccl` alias is declared beside it).
    pub name: &'static str,
    /// `(name, C type)` of each parameter.
    pub params: &'static [(&'static str, &'static str)],
}

impl Prototype {
    /// Its declaration with `prefix` before the name (`""` or `"p"`).
    pub fn declare(&self, prefix: &str) -> String {
        let params = if self.params.is_empty() {
            "void".to_string()
        } else {
            self.params.iter().map(|(n, t)| format!("{t} {n}")).collect::<Vec<_>>().join(", ")
        };
        format!("{} {prefix}{}({params});", self.ret, self.name)
    }
}

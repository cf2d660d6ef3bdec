//! What the compiler accepts, checked before it allocates anything for a program.
//!
//! [`MAX_RANKS`], [`MAX_CHANNELS`] and [`MAX_CHUNKS`] are the MSCCL runtime's: it keeps these
//! fields in fixed-width integers and fixed-size tables, so a program beyond them cannot be
//! loaded. [`MAX_WORK`] is the compiler's own budget, which bounds its time and memory: an
//! algorithm's instruction count grows with the square of its ranks (or faster), and without
//! a bound `--ranks 10000` ran out of memory instead of failing.
//!
//! [`RUNTIME_MAX_STEPS`] and [`RUNTIME_MAX_THREADBLOCKS`] are also the runtime's, but they
//! depend on the runtime build and are properties of the compiled output, so `msccl compile`
//! warns about them ([`super::ir::runtime_warnings`]) rather than refusing.
//!
//! Sources: microsoft/msccl `src/include/msccl.h` (`struct mscclTransfer`, `mscclThreadBlock`,
//! `MSCCL_MAX_*`) and `src/include/devcomm.h` (`MAXCHANNELS`); Azure/msccl-executor-nccl
//! `src/include/msccl/msccl_struct.h` and `src/misc/msccl/msccl_parser.cc`, which keep the same
//! field widths.
use super::MscclError;

/// Ranks (`ngpus`): a threadblock's peers are `int16_t` in the runtime (`sendpeer`/`recvpeer`
/// of `mscclThreadBlock`), so ranks `0..=32767` are all it can name.
pub const MAX_RANKS: u32 = 32_768;

/// Channels of a compiled program (`nchannels`; instances multiply it): NCCL's `MAXCHANNELS`,
/// 32 in the `devcomm.h` MSCCL builds on, which sizes the runtime's per-channel tables
/// (`mscclChannels[MAXCHANNELS]`) and bounds the `chan` the parser accepts.
pub const MAX_CHANNELS: u32 = 32;

/// Chunks in any one buffer of a rank (`i_chunks`, `o_chunks`, `s_chunks`; instances multiply
/// them): step offsets are `int16_t` in the runtime (`srcoffset`/`dstoffset` of
/// `mscclTransfer`), so chunk 32767 is the last one a step can address.
pub const MAX_CHUNKS: u32 = 32_768;

/// The compiler's budget of chunk transfers per program: the chunks its operations move,
/// summed, times instances — about the number of steps it emits. Compile time and memory
/// grow linearly with it, about 0.8 KB of peak memory per transfer (ring all-reduce on 1024
/// ranks, 2.1M transfers: 1.7 GiB, 8 s), so 2^22 keeps a compile under about 3.5 GiB. Ring
/// all-reduce fits on up to 1448 ranks, ring all-gather on up to 2048.
pub const MAX_WORK: u64 = 1 << 22;

/// Buffer slots the DSL traces (ranks × chunks of every buffer): it keeps each slot's symbolic
/// value, a few dozen bytes, so 2^24 slots stay under a GiB. Looser than [`MAX_WORK`] because a
/// slot costs far less than a compiled transfer (in-place all-reduce has twice as many slots
/// as its buffers, since its output aliases its input). The MSCCL-IR reader bounds the chunks
/// of all gpus' buffers, summed, by it too: the checker keeps about 100 bytes a slot, so a
/// file at the limit takes up to about 1.6 GiB to check however short it is.
pub const MAX_SLOTS: u64 = 1 << 24;

/// Largest MSCCL-IR file `msccl check` (and [`ir::read_file`]) reads: 256 MiB. Checking costs
/// about 10 bytes of memory per byte of the file (a 3.9 MB ring all-reduce on 128 ranks peaks at
/// 37 MB), so a file at the limit stays within about the 3.5 GiB a compile at [`MAX_WORK`] may
/// take. Files the runtime can load are far smaller ([`RUNTIME_MAX_STEPS`] steps of about 130
/// bytes in each of [`RUNTIME_MAX_THREADBLOCKS`] threadblocks is 7 MB a GPU); the largest
/// compile (`MAX_WORK` transfers) writes about 500 MB, which this refuses to check.
pub const MAX_IR_FILE_BYTES: u64 = 256 << 20;

/// Steps per threadblock the runtime loads: `MSCCL_MAX_NUM_STEPS`, 256 in microsoft/msccl
/// (64 in msccl-executor-nccl); its parser rejects a `<step s>` at or beyond it.
pub const RUNTIME_MAX_STEPS: usize = 256;

/// Threadblocks per GPU the runtime loads: `MSCCL_MAX_NUM_THREAD_BLOCKS`, 108*2 = 216 in
/// microsoft/msccl (32 per channel × `MAXCHANNELS` in msccl-executor-nccl).
pub const RUNTIME_MAX_THREADBLOCKS: usize = 216;

/// `Err` when `value` of `param` is over `limit`; `reason` says where the limit comes from.
pub fn check(param: &str, value: u64, limit: u64, reason: &str) -> Result<(), MscclError> {
    if value > limit {
        return Err(MscclError::Limit { param: param.to_string(), value, limit, reason: reason.to_string() });
    }
    Ok(())
}

/// Checks `ranks` against [`MAX_RANKS`].
pub fn check_ranks(param: &str, ranks: u64) -> Result<(), MscclError> {
    check(param, ranks, u64::from(MAX_RANKS), "MSCCL keeps peers as int16_t (MAX_RANKS)")
}

/// Checks the channels a compiled program uses against [`MAX_CHANNELS`].
pub fn check_channels(param: &str, channels: u64) -> Result<(), MscclError> {
    check(param, channels, u64::from(MAX_CHANNELS), "MSCCL's MAXCHANNELS (MAX_CHANNELS)")
}

const CHUNKS_REASON: &str = "chunks per buffer; MSCCL keeps step offsets as int16_t (MAX_CHUNKS)";

/// Checks the chunks of one buffer of a compiled program against [`MAX_CHUNKS`].
pub fn check_chunks(param: &str, chunks: u64) -> Result<(), MscclError> {
    check(param, chunks, u64::from(MAX_CHUNKS), CHUNKS_REASON)
}

/// The error for a buffer of `chunks` chunks, for callers that already know it is too many.
pub fn too_many_chunks(param: &str, chunks: u64) -> MscclError {
    MscclError::Limit {
        param: param.to_string(),
        value: chunks,
        limit: u64::from(MAX_CHUNKS),
        reason: CHUNKS_REASON.to_string(),
    }
}

/// Product of factors, `None` on overflow: sizes computed from user values never wrap.
pub fn product(factors: &[u64]) -> Option<u64> {
    factors.iter().try_fold(1u64, |acc, &f| acc.checked_mul(f))
}

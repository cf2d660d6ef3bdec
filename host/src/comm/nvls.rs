//! NVLS for a communicator on one node: the scratch and barrier flags every rank binds into
//! multicast ranges at init, when NVLS applies, and the choice per call (NCCL's rules: NVLS
//! heads in the topology, more than two ranks, one node, a multimem form for the type and op,
//! multicast support; `RSCCL_ALGO` as `NCCL_ALGO` forces or forbids it).
use super::algo_mask::NvlsPolicy;
use super::nvls_layout::FifoLayout;
use crate::backend::{Backend, BackendKind, DeviceBuffer, MulticastObject};
use crate::bootstrap::{Bootstrap, PeerInfo};
use crate::error::{Error, Result};
use rsccl_device::coll::nvls_fifo::{NvlsChannel, MAX_NVLS_ARITY};
use rsccl_device::coll::Collective;
use rsccl_device::dtype::DataType;
use rsccl_device::multimem;
use rsccl_device::redop::RedOp;
use rsccl_device::DevPtr;
use std::any::Any;
use std::sync::Arc;

pub use super::nvls_layout::{NVLS_SLICE_BYTES, NVLS_STEP_BYTES};

/// All-reduces of at most this many bytes run one-shot (every rank reduce-loads the whole
/// buffer), larger ones two-shot.
pub const NVLS_ONE_SHOT_MAX_BYTES: u64 = 64 << 10;

/// Whether NVLS serves `coll` on `dtype` with `op` (all-gather moves bytes: any type with a
/// multimem store).
pub fn applies(coll: Collective, dtype: DataType, op: RedOp) -> bool {
    match coll {
        Collective::AllReduce | Collective::ReduceScatter => multimem::supported(op, dtype),
        Collective::AllGather => multimem::supported(RedOp::Sum, dtype),
        _ => false,
    }
}

/// One rank's NVLS resources: its scratch and flags and their multicast addresses, and the
/// FIFO form's connections.
///
/// The scratch holds the one-shot windows (`grid × nranks` slices), then NCCL's FIFOs
/// (`nvlsPerRankSize = nChannels × 2 × buffSize` per head): for head `h` and channel `c` the
/// reduce FIFO at `(h·2·nch + c)·buffSize` and the broadcast FIFO at `((h·2 + 1)·nch + c)·
/// buffSize`. The flags hold the barrier words (`grid × nranks`), then each FIFO's credit
/// words at the same index × [`NVLS_CREDIT_BYTES`], then the call signatures (`grid × nranks
/// × 2` slots). Both are bound, so every offset has a unicast address here and a multicast one.
pub(crate) struct Nvls {
    /// The multicast mappings (a GPU's), dropped first.
    _maps: Vec<Box<dyn Any + Send + Sync>>,
    pub(crate) scratch: DeviceBuffer,
    pub(crate) flags: DeviceBuffer,
    pub(crate) mc_scratch: DevPtr,
    pub(crate) mc_flags: DevPtr,
    /// `NvlsChannel[grid]`.
    pub(crate) channels: DeviceBuffer,
    /// This rank's saved step of every FIFO connection (not bound: each side its own).
    _steps: DeviceBuffer,
    /// Bytes of one FIFO slot.
    pub(crate) step_bytes: u64,
    /// Blocks of a launch (each its own scratch window and flags, one channel each).
    pub(crate) grid: u32,
    /// Byte offset of the call signatures in the flags.
    pub(crate) sigs: u64,
    /// The ranks are separate processes: their scratch was mapped, not addressed directly.
    pub(crate) across_processes: bool,
    /// Bound into GPU multicast objects: the peers' kernels reach this rank's memory through
    /// the object, so it is unbound only once they stopped
    /// ([`wait_peers_stopped`](super::departure::wait_peers_stopped)).
    pub(crate) objects: bool,
    _binds: Vec<Box<dyn Any + Send + Sync>>,
}

/// Why NVLS cannot run, from what every rank knows alike (so all decide the same), or `None`.
fn unavailable(want: bool, nranks: usize) -> Option<String> {
    if !want {
        return Some("the topology has no NVLS heads (CommConfig::nvls is off)".into());
    }
    if nranks <= 2 {
        return Some(format!("{nranks} ranks: NVLS needs more than 2 on a node"));
    }
    if nranks > MAX_NVLS_ARITY {
        return Some(format!("{nranks} ranks on a node: NVLS serves at most {MAX_NVLS_ARITY}"));
    }
    None
}

/// Whether to set NVLS up, decided at init from what every rank knows alike (before any
/// connection, so that a forced NVLS that cannot run fails every rank the same way).
pub(crate) fn plan(want: bool, peers: &[PeerInfo], policy: NvlsPolicy) -> Result<bool> {
    if policy == NvlsPolicy::Off {
        return Ok(false);
    }
    // Across nodes NVLS_TREE decides (after init, with sub-communicators).
    if peers.iter().any(|p| p.host_hash != peers[0].host_hash) {
        return Ok(false);
    }
    match unavailable(want, peers.len()) {
        None => Ok(true),
        Some(why) if policy == NvlsPolicy::Forced => Err(forced(policy, why)),
        Some(_) => Ok(false),
    }
}

/// NVLS that `policy` (forced or required) wants but cannot run, for `why`.
pub(super) fn forced(policy: NvlsPolicy, why: String) -> Error {
    Error::InvalidConfig(format!("{}, but NVLS cannot run on this communicator: {why}", policy.setting()))
}

/// Most bytes of one rank's NVLS memory handle in the setup exchange (a CUDA IPC handle is 64,
/// the emulator's a size and a segment name).
const MAX_NVLS_HANDLE: usize = 256;

/// Sets NVLS up (after [`plan`] said so): every rank allocates its scratch and flags, the
/// ranks exchange them, and each binds every rank's copy, in rank order, into its own
/// multicast ranges. Ranks of one process exchange addresses; ranks in separate processes
/// (the CPU emulator's multi-process communicators) allocate exportable memory, exchange its
/// handles and map each other's, as the GPU's multicast object maps every rank's physical
/// memory. `None` when binding failed on some rank (an error when `policy` forces NVLS).
pub(crate) fn setup(
    boot: &mut Bootstrap,
    rank: usize,
    peers: &[PeerInfo],
    backend: &std::sync::Arc<dyn Backend>,
    nchannels: usize,
    step_bytes: u64,
    policy: NvlsPolicy,
) -> Result<Option<Nvls>> {
    let nranks = peers.len();
    let grid = nchannels as u32;
    // Every rank heads the slot of its own index: init turned NVLS on only where the search's
    // heads are so ([`heads_of`](super::topo::heads_of)).
    let layout = FifoLayout::new(nranks, nchannels, step_bytes)?;
    let too_big = || Error::InvalidConfig("NVLS scratch size overflows".into());
    let scratch_bytes = usize::try_from(layout.scratch_bytes()).map_err(|_| too_big())?;
    let flag_bytes = usize::try_from(layout.flag_bytes()).map_err(|_| too_big())?;
    let across = backend.kind() == BackendKind::Cpu && peers.iter().any(|p| p.pid != peers[0].pid);
    let bound = bind(boot, rank, nranks, backend, &[scratch_bytes, flag_bytes], across, "NVLS memory")?;
    // Every rank learned whether all bound, and all go on or fall back (or fail) alike.
    let b = match bound {
        Ok(b) => b,
        Err(why) => return if policy.must_come_up() { Err(forced(policy, why)) } else { Ok(None) },
    };
    let mut bufs = b.bufs.into_iter();
    let two = "bound as asked: scratch and flags";
    let ((scratch, mc_scratch), (flags, mc_flags)) = (bufs.next().expect(two), bufs.next().expect(two));
    tracing::info!(
        rank,
        "NVLS: {nranks} heads, {grid} channel(s), {} KiB FIFO slots, {} KiB scratch per rank{}",
        layout.step_bytes >> 10,
        scratch_bytes >> 10,
        if across { ", peers' scratch mapped from their processes" } else { "" }
    );
    let steps = backend.alloc(usize::try_from(layout.step_words() * 8).map_err(|_| too_big())?)?;
    let (uc, mc) = ((scratch.ptr(), flags.ptr()), (mc_scratch, mc_flags));
    let chans: Vec<NvlsChannel> =
        (0..nchannels).map(|c| layout.channel(c, rank, uc, mc, steps.ptr())).collect();
    let channels = backend.alloc(std::mem::size_of_val(chans.as_slice()))?;
    backend.copy_in(&channels, 0, bytemuck::cast_slice(&chans))?;
    Ok(Some(Nvls {
        _maps: b.maps,
        scratch,
        flags,
        mc_scratch,
        mc_flags,
        channels,
        _steps: steps,
        step_bytes: layout.step_bytes,
        grid,
        sigs: layout.sig_base(),
        across_processes: across,
        objects: backend.multicast_objects(),
        _binds: b.keep,
    }))
}

/// Longest failure message a rank sends in [`agree`].
const MAX_WHY_BYTES: usize = 512;

/// Every rank's outcome of one setup step, so all go on or stop together: `r` when every rank
/// succeeded, else why the first that failed did (`what` it could not do, and its message).
/// `Err` only when the bootstrap itself fails.
fn agree<T>(boot: &mut Bootstrap, what: &str, r: Result<T>) -> Result<std::result::Result<T, String>> {
    let msg = match &r {
        Ok(_) => vec![1],
        Err(e) => {
            let mut m = vec![0];
            m.extend(e.to_string().bytes().take(MAX_WHY_BYTES));
            m
        }
    };
    let all = boot.all_gather(&msg)?;
    Ok(match all.iter().position(|b| b.first() != Some(&1)) {
        None => r.map_err(|e| e.to_string()),
        Some(q) => Err(format!(
            "rank {q} could not {what}: {}",
            String::from_utf8_lossy(all[q].get(1..).unwrap_or_default())
        )),
    })
}

/// This rank's memory bound into multicast ranges, one per size asked for ([`bind`]).
pub(super) struct Multicast {
    /// Per range: this rank's memory and the multicast address of the range.
    pub(super) bufs: Vec<(DeviceBuffer, DevPtr)>,
    /// The multicast mappings (a GPU's), to release before the memory bound behind them
    /// (NCCL's order).
    pub(super) maps: Vec<Box<dyn Any + Send + Sync>>,
    /// What keeps the ranges bound (the objects; or the bindings, then the peers' mappings
    /// they point into), released after this rank's memory.
    pub(super) keep: Vec<Box<dyn Any + Send + Sync>>,
}

/// Binds this rank's new memory of each of `sizes` into a multicast range with every other
/// rank's (a collective of all ranks): from multicast objects where the backend makes
/// multicast memory that way (a GPU's), else by address ([`bind_addresses`]; `across`: the
/// ranks are separate processes of the CPU emulator). `Ok(Err(why))` names the first rank that
/// failed a step (`what` the memory is), every rank alike; `Err` only when the bootstrap fails.
pub(super) fn bind(
    boot: &mut Bootstrap,
    rank: usize,
    nranks: usize,
    backend: &std::sync::Arc<dyn Backend>,
    sizes: &[usize],
    across: bool,
    what: &str,
) -> Result<std::result::Result<Multicast, String>> {
    if backend.multicast_objects() {
        bind_objects(boot, rank, nranks, backend, sizes)
    } else {
        bind_addresses(boot, rank, backend, sizes, across, what)
    }
}

/// Multicast memory from multicast objects (a GPU's way; NCCL's steps, every rank done with
/// one before any starts the next): rank 0 creates one object per size and shares their
/// handles; every rank opens them and adds its device; every rank binds memory of its own;
/// every rank maps the ranges. `Ok(Err(why))` names the first rank that failed a step (every
/// rank learns it alike); `Err` only when the bootstrap fails.
fn bind_objects(
    boot: &mut Bootstrap,
    rank: usize,
    nranks: usize,
    backend: &std::sync::Arc<dyn Backend>,
    sizes: &[usize],
) -> Result<std::result::Result<Multicast, String>> {
    let created = if rank == 0 {
        sizes.iter().map(|&b| backend.multicast_create(b, nranks)).collect::<Result<Vec<_>>>()
    } else {
        Ok(Vec::new())
    };
    // Rank 0 sends its handles (nothing when it failed); the others send nothing.
    let msg = match &created {
        Ok(v) if v.len() == sizes.len() => {
            encode_handles(&v.iter().map(|(_, h)| &h[..]).collect::<Vec<_>>())?
        }
        _ => Vec::new(),
    };
    let all = boot.all_gather(&msg)?;
    let objects: Result<Vec<Arc<dyn MulticastObject>>> = match created {
        Ok(v) if rank == 0 => Ok(v.into_iter().map(|(o, _)| o).collect()),
        Err(e) => Err(e),
        Ok(_) => match decode_handles(&all[0], sizes.len()) {
            Some(hs) => hs.iter().map(|h| backend.multicast_open(h)).collect(),
            None => Err(Error::InvalidConfig(format!(
                "rank 0 sent no usable multicast handles ({} bytes)",
                all[0].len()
            ))),
        },
    };
    let joined = objects.and_then(|o| {
        o.iter().try_for_each(|m| m.add_device())?;
        Ok(o)
    });
    let objects = match agree(boot, "open and join the NVLS multicast objects", joined)? {
        Ok(o) => o,
        Err(why) => return Ok(Err(why)),
    };
    let members = objects.iter().map(|m| m.bind_new()).collect::<Result<Vec<_>>>();
    let members = match agree(boot, "bind its NVLS memory", members)? {
        Ok(m) => m,
        Err(why) => return Ok(Err(why)),
    };
    let maps = objects.iter().map(|m| m.map()).collect::<Result<Vec<_>>>();
    let maps = match agree(boot, "map the NVLS multicast ranges", maps)? {
        Ok(m) => m,
        Err(why) => return Ok(Err(why)),
    };
    let bufs = members.into_iter().zip(maps.iter().map(|(p, _)| *p)).collect();
    let maps = maps.into_iter().map(|(_, g)| g).collect();
    let keep = objects.into_iter().map(|o| Box::new(o) as Box<dyn Any + Send + Sync>).collect();
    Ok(Ok(Multicast { bufs, maps, keep }))
}

/// Multicast memory on the CPU emulator: every rank allocates its buffers (exportable when
/// the ranks are separate processes, which then map each other's) and binds every rank's
/// copy, in rank order, into its own multicast ranges by address.
fn bind_addresses(
    boot: &mut Bootstrap,
    rank: usize,
    backend: &std::sync::Arc<dyn Backend>,
    sizes: &[usize],
    across: bool,
    what: &str,
) -> Result<std::result::Result<Multicast, String>> {
    let (bufs, uc, peers) = if across {
        match map_across(boot, rank, backend, sizes, what)? {
            Ok(m) => (m.bufs, m.uc, m.keep),
            Err(why) => return Ok(Err(why)),
        }
    } else {
        let bufs = sizes.iter().map(|&b| backend.alloc(b)).collect::<Result<Vec<_>>>()?;
        super::shared_here::offer(&bufs);
        let uc = bufs
            .iter()
            .map(|b| exchange_windows(|m| boot.all_gather(m), b.ptr(), b.len() as u64, what))
            .collect::<Result<Vec<_>>>()?;
        (bufs, uc, Vec::new())
    };
    // Ranks of this process keep every peer's copy alive as long as they can reach it.
    let shares = if across { Ok(Vec::new()) } else { super::shared_here::take(&uc, rank) };
    let bound = shares.and_then(|shares| {
        let b =
            uc.iter().zip(sizes).map(|(uc, &b)| backend.multicast_bind(uc, b)).collect::<Result<Vec<_>>>()?;
        Ok((b, shares))
    });
    let (bound, shares) = match agree(boot, &format!("bind its {what} into multicast ranges"), bound)? {
        Ok(b) => b,
        Err(why) => return Ok(Err(why)),
    };
    // The multicast bindings go before the peers' mappings (or shares) they point into.
    let (mcs, mut keep): (Vec<DevPtr>, Vec<_>) = bound.into_iter().unzip();
    keep.extend(peers);
    keep.extend(shares.into_iter().map(|s| Box::new(s) as Box<dyn Any + Send + Sync>));
    Ok(Ok(Multicast { bufs: bufs.into_iter().zip(mcs).collect(), maps: Vec::new(), keep }))
}

/// A rank's NVLS memory when the ranks are separate processes: per buffer, its own copy
/// (exportable) and every rank's copy as an address here (its own, and the others' mapped);
/// and the mappings.
struct Mapped {
    bufs: Vec<DeviceBuffer>,
    /// `uc[k][r]`: rank `r`'s copy of buffer `k`, addressed in this process.
    uc: Vec<Vec<DevPtr>>,
    keep: Vec<Box<dyn Any + Send + Sync>>,
}

/// Allocates this rank's buffers of `sizes` exportable, exchanges the handles and maps every
/// other rank's (`what` they are, for messages). Every rank ends knowing whether all
/// succeeded: `Ok(Err(why))` when some rank could not allocate or map (so all fall back
/// together instead of some waiting for the others); `Err` only when the bootstrap fails.
fn map_across(
    boot: &mut Bootstrap,
    rank: usize,
    backend: &std::sync::Arc<dyn Backend>,
    sizes: &[usize],
    what: &str,
) -> Result<std::result::Result<Mapped, String>> {
    let mine: Result<Vec<(DeviceBuffer, Vec<u8>)>> =
        sizes.iter().map(|&b| backend.alloc_exported(b)).collect();
    // An empty message says this rank has no memory to share.
    let msg = match &mine {
        Ok(v) => encode_handles(&v.iter().map(|(_, h)| h.as_slice()).collect::<Vec<_>>())?,
        Err(_) => Vec::new(),
    };
    let all = boot.all_gather(&msg)?;
    let mut keep: Vec<Box<dyn Any + Send + Sync>> = Vec::new();
    let opened = match &mine {
        Err(e) => Err(format!("rank {rank} could not allocate its {what}: {e}")),
        Ok(own) => {
            let mut uc: Vec<Vec<DevPtr>> = vec![Vec::with_capacity(all.len()); sizes.len()];
            let mut res = Ok(());
            'ranks: for (r, b) in all.iter().enumerate() {
                if r == rank {
                    for (k, (buf, _)) in own.iter().enumerate() {
                        uc[k].push(buf.ptr());
                    }
                    continue;
                }
                let Some(handles) = decode_handles(b, sizes.len()) else {
                    res = Err(if b.is_empty() {
                        format!("rank {r} could not allocate its {what}")
                    } else {
                        format!("rank {r} sent a malformed {what} handle message ({} bytes)", b.len())
                    });
                    break;
                };
                for (k, h) in handles.into_iter().enumerate() {
                    match backend.open_exported(h) {
                        Ok((p, guard)) => {
                            uc[k].push(p);
                            keep.push(guard);
                        }
                        Err(e) => {
                            res = Err(format!("rank {rank} could not map rank {r}'s {what}: {e}"));
                            break 'ranks;
                        }
                    }
                }
            }
            res.map(|()| uc)
        }
    };
    // Every rank has tried to map every other's memory: no name is needed any longer.
    let ok = boot.all_gather(&[u8::from(opened.is_ok())])?;
    if let Ok(own) = &mine {
        for (_, h) in own {
            backend.unpublish_exported(h);
        }
    }
    Ok(match (opened, mine, ok.iter().all(|b| b == &[1])) {
        (Ok(uc), Ok(own), true) => Ok(Mapped { bufs: own.into_iter().map(|(b, _)| b).collect(), uc, keep }),
        (Err(why), ..) => Err(why),
        _ => Err(format!("another rank could not allocate or map its {what}")),
    })
}

/// A setup message of memory handles (a rank's scratch and flags, or rank 0's multicast
/// objects): each after a 2-byte little-endian length.
fn encode_handles(handles: &[&[u8]]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(handles.iter().map(|h| 2 + h.len()).sum());
    for h in handles {
        if h.len() > MAX_NVLS_HANDLE {
            return Err(Error::InvalidConfig(format!(
                "NVLS: a memory handle of {} bytes (at most {MAX_NVLS_HANDLE})",
                h.len()
            )));
        }
        out.extend_from_slice(&(h.len() as u16).to_le_bytes());
        out.extend_from_slice(h);
    }
    Ok(out)
}

/// The `n` handles of an [`encode_handles`] message; `None` when it is malformed.
fn decode_handles(mut b: &[u8], n: usize) -> Option<Vec<&[u8]>> {
    let mut v = Vec::with_capacity(n.min(8));
    for _ in 0..n {
        let (h, rest) = take_handle(b)?;
        v.push(h);
        b = rest;
    }
    b.is_empty().then_some(v)
}

/// One length-prefixed handle from the front of `b`, and what follows it.
fn take_handle(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u16::from_le_bytes(b.get(..2)?.try_into().ok()?) as usize;
    if len > MAX_NVLS_HANDLE {
        return None;
    }
    Some((b.get(2..2 + len)?, b.get(2 + len..)?))
}

/// Every rank's address of its part of a window whose part here is `len` bytes at `base`, in
/// one all-gather (`all_gather`); a rank whose part has another size is refused, named (`what`
/// says which kind of window).
pub(crate) fn exchange_windows(
    all_gather: impl FnOnce(&[u8]) -> Result<Vec<Vec<u8>>>,
    base: DevPtr,
    len: u64,
    what: &str,
) -> Result<Vec<DevPtr>> {
    let mut mine = base.0.to_le_bytes().to_vec();
    mine.extend_from_slice(&len.to_le_bytes());
    let all = all_gather(&mine)?;
    let mut ptrs = Vec::with_capacity(all.len());
    for (r, b) in all.iter().enumerate() {
        let (Some(p), Some(l), 16) = (b.get(..8), b.get(8..16), b.len()) else {
            return Err(Error::InvalidConfig(format!(
                "{what}: rank {r} sent {} bytes for its window",
                b.len()
            )));
        };
        let (p, l) = (
            u64::from_le_bytes(p.try_into().expect("8 bytes")),
            u64::from_le_bytes(l.try_into().expect("8 bytes")),
        );
        if l != len {
            return Err(Error::InvalidConfig(format!(
                "{what}: rank {r} gives {l} bytes and this rank {len}; every rank must give the same size"
            )));
        }
        ptrs.push(DevPtr(p));
    }
    Ok(ptrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_messages_round_trip_and_garbage_is_refused() {
        let (s, f) = (vec![1u8, 2, 3], vec![9u8; 40]);
        let msg = encode_handles(&[&s, &f]).unwrap();
        assert_eq!(decode_handles(&msg, 2), Some(vec![&s[..], &f[..]]));
        assert_eq!(decode_handles(&msg, 1), None);
        assert_eq!(decode_handles(&msg, 3), None);
        assert_eq!(decode_handles(&encode_handles(&[&[], &[]]).unwrap(), 2), Some(vec![&[][..], &[][..]]));
        assert_eq!(decode_handles(&encode_handles(&[&f]).unwrap(), 1), Some(vec![&f[..]]));
        // Truncated anywhere, a trailing byte, or a length over the limit: refused, never read
        // past the message.
        for cut in 0..msg.len() {
            assert_eq!(decode_handles(&msg[..cut], 2), None, "cut at {cut}");
        }
        let mut long = msg.clone();
        long.push(0);
        assert_eq!(decode_handles(&long, 2), None);
        let mut over = vec![0u8; 2 + MAX_NVLS_HANDLE + 1 + 2];
        over[..2].copy_from_slice(&((MAX_NVLS_HANDLE + 1) as u16).to_le_bytes());
        assert_eq!(decode_handles(&over, 2), None);
        assert_eq!(decode_handles(&[0xFF, 0xFF, 1, 2, 3], 2), None);
        // A handle over the limit is refused when encoding, naming the size.
        let e = encode_handles(&[&vec![0; MAX_NVLS_HANDLE + 1], &[]]).unwrap_err().to_string();
        assert!(e.contains(&format!("{}", MAX_NVLS_HANDLE + 1)), "{e}");
    }
}

//! Transports: where a connection's FIFO lives and how both ends reach it.
//!
//! A connection (one direction between two ranks) is set up in NCCL's phases: the **receiver**
//! allocates the FIFO memory ([`Transport::listen`]) and hands the sender a small
//! [`ConnHandle`] over the bootstrap; the **sender** attaches to it ([`Transport::connect`]);
//! each side then builds the [`ConnInfo`] its kernel sees from its own address of that memory
//! ([`ConnLayout::view`]). Dropping a [`ConnMem`] releases that side's mapping; memory stays
//! valid while either side holds it.
//!
//! Which transport a peer gets is chosen as NCCL chooses (P2P, then SHM, then NET): a peer in
//! this process gets the in-process transport ([`local`]), a peer on this host device memory
//! mapped across processes when both are GPUs that reach each other ([`p2p`]), else shared
//! memory ([`shm`]), a peer on another host the network ([`net`]: a proxy thread and a network
//! plugin).
pub mod local;
pub mod net;
pub mod p2p;
pub mod shm;

use crate::backend::Backend;
use crate::error::{Error, Result};
use rsccl_device::prims::conn::{ConnInfo, CALL_SIG_BYTES, NCCL_STEPS};
use rsccl_device::DevPtr;
use std::any::Any;
use std::sync::Arc;

/// The byte layout of one connection's memory, the one definition every transport and both
/// sides use: the Simple region — its FIFO (`NCCL_STEPS` slots of `step_bytes`), then the
/// head, tail, sender-step and receiver-step words, the sizes FIFO and the call signatures —
/// then, when `ll_step_bytes` is not 0, the LL region laid out the same way with slots of
/// `ll_step_bytes`, then, when `ll128_step_bytes` is not 0, the LL128 region at the next
/// 128-byte boundary (each protocol has its own FIFO, credits and steps, as NCCL's
/// `conn[NCCL_NUM_PROTOCOLS]`: a line left by one protocol is never read by another).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLayout {
    /// Bytes per Simple FIFO slot.
    pub step_bytes: u64,
    /// Bytes per LL FIFO slot (16-byte lines); 0: the connection has no LL FIFO.
    pub ll_step_bytes: u64,
    /// Bytes per LL128 FIFO slot (128-byte lines); 0: no LL128 FIFO (network connections:
    /// their proxy checks LL flags only; and paths LL128 is not enabled on unless forced).
    pub ll128_step_bytes: u64,
}

/// Which end of a connection a view is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// Writes the FIFO, advances `tail`.
    Send,
    /// Reads the FIFO, advances `head`.
    Recv,
}

impl ConnLayout {
    const HEAD: u64 = 0;
    const TAIL: u64 = 8;
    const SEND_STEP: u64 = 16;
    const RECV_STEP: u64 = 24;
    const SIZES: u64 = 32;
    /// The call signatures, one per FIFO slot, after the sizes.
    const SIGS: u64 = Self::SIZES + NCCL_STEPS * 8;
    /// Bytes after one region's FIFO: its words, sizes and signatures (a multiple of 16, so
    /// the next region's lines stay 16-byte aligned).
    const WORDS_BYTES: u64 = Self::SIGS + NCCL_STEPS * CALL_SIG_BYTES;
    /// Where an LL128 region may start: a line's 128 bytes are one aligned store.
    const LL128_ALIGN: u64 = rsccl_device::prims::ll128::LL128_LINE_BYTES;

    /// A layout with only a Simple FIFO of `step_bytes` slots.
    pub const fn simple(step_bytes: u64) -> ConnLayout {
        ConnLayout { step_bytes, ll_step_bytes: 0, ll128_step_bytes: 0 }
    }

    /// Bytes of one protocol's region with slots of `step`.
    fn region(step: u64) -> Option<u64> {
        NCCL_STEPS.checked_mul(step).and_then(|fifo| fifo.checked_add(Self::WORDS_BYTES))
    }

    /// Bytes of an optional protocol's region with slots of `step` (0: no region).
    fn optional(step: u64) -> Option<u64> {
        if step == 0 {
            Some(0)
        } else {
            Self::region(step)
        }
    }

    /// The offsets of the LL and LL128 regions and the connection's size.
    fn offsets(&self) -> Option<(u64, u64, u64)> {
        let ll = Self::region(self.step_bytes)?;
        let ll_end = ll.checked_add(Self::optional(self.ll_step_bytes)?)?;
        if self.ll128_step_bytes == 0 {
            return Some((ll, ll_end, ll_end));
        }
        let ll128 = ll_end.checked_next_multiple_of(Self::LL128_ALIGN)?;
        Some((ll, ll128, ll128.checked_add(Self::optional(self.ll128_step_bytes)?)?))
    }

    /// Bytes of one connection's memory, or an error when the slot sizes make it overflow.
    ///
    /// ```
    /// use rsccl::transport::ConnLayout;
    /// assert_eq!(ConnLayout::simple(128).bytes().unwrap(), 8 * 128 + 32 + 64 + 8 * 32);
    /// let both = ConnLayout { step_bytes: 128, ll_step_bytes: 256, ll128_step_bytes: 0 };
    /// assert_eq!(both.bytes().unwrap(), 8 * 128 + 352 + 8 * 256 + 352);
    /// // LL128 starts at the next 128-byte boundary (3776 → 3840).
    /// let all = ConnLayout { ll128_step_bytes: 1024, ..both };
    /// assert_eq!(all.bytes().unwrap(), 3840 + 8 * 1024 + 352);
    /// assert!(ConnLayout::simple(u64::MAX / 4).bytes().is_err());
    /// ```
    pub fn bytes(&self) -> Result<usize> {
        self.offsets().and_then(|(_, _, b)| usize::try_from(b).ok()).ok_or_else(|| {
            Error::InvalidConfig(format!(
                "step_bytes {}, ll_step_bytes {} and ll128_step_bytes {} make a connection overflow",
                self.step_bytes, self.ll_step_bytes, self.ll128_step_bytes
            ))
        })
    }

    /// The view of `side` of a connection whose memory starts at `base` in this process, with
    /// `peer` the rank at the other end: its Simple FIFO.
    pub fn view(&self, base: DevPtr, side: Side, peer: usize) -> ConnInfo {
        Self::region_view(base, self.step_bytes, side, peer)
    }

    /// The view of `side` of the connection's LL FIFO (`None` without one).
    pub fn view_ll(&self, base: DevPtr, side: Side, peer: usize) -> Option<ConnInfo> {
        let (ll, _, _) = self.offsets().expect("bytes() checked the layout");
        (self.ll_step_bytes != 0).then(|| Self::region_view(base.offset(ll), self.ll_step_bytes, side, peer))
    }

    /// The view of `side` of the connection's LL128 FIFO (`None` without one); its lines are
    /// 128-byte aligned when `base` is.
    pub fn view_ll128(&self, base: DevPtr, side: Side, peer: usize) -> Option<ConnInfo> {
        let (_, ll128, _) = self.offsets().expect("bytes() checked the layout");
        (self.ll128_step_bytes != 0)
            .then(|| Self::region_view(base.offset(ll128), self.ll128_step_bytes, side, peer))
    }

    fn region_view(base: DevPtr, step_bytes: u64, side: Side, peer: usize) -> ConnInfo {
        let words = base.offset(NCCL_STEPS * step_bytes);
        ConnInfo {
            buff: base,
            head: words.offset(Self::HEAD),
            tail: words.offset(Self::TAIL),
            step: words.offset(match side {
                Side::Send => Self::SEND_STEP,
                Side::Recv => Self::RECV_STEP,
            }),
            sizes_fifo: words.offset(Self::SIZES),
            sig: words.offset(Self::SIGS),
            step_bytes,
            flags: 0,
            peer: peer as u64,
        }
    }
}

/// One side's hold on a connection's memory: its address in this process and whatever keeps
/// it alive (a buffer shared with the other side, a mapping of a segment).
pub struct ConnMem {
    base: DevPtr,
    len: usize,
    _keep: Box<dyn Any + Send + Sync>,
}

impl ConnMem {
    pub(crate) fn new(base: DevPtr, len: usize, keep: Box<dyn Any + Send + Sync>) -> Self {
        ConnMem { base, len, _keep: keep }
    }
    /// The device address of the connection's first byte in this process.
    pub fn base(&self) -> DevPtr {
        self.base
    }
    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it is empty (never: a connection has at least its FIFO).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for ConnMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ConnMem({:#x}, {} bytes)", self.base.0, self.len)
    }
}

/// What the receiver sends the sender so it can attach: transport-specific bytes (at most
/// [`MAX_HANDLE_BYTES`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnHandle(pub Vec<u8>);

/// Largest [`ConnHandle`] a sender accepts.
pub const MAX_HANDLE_BYTES: usize = 512;

/// Which transport connects two ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// Both ranks in one process: memory of the shared backend.
    InProcess,
    /// GPU ranks in different processes of one host whose devices reach each other: the
    /// receiver's device memory, mapped by the sender (CUDA IPC).
    P2p,
    /// Ranks on one host: a POSIX shared-memory segment both map.
    Shm,
    /// Ranks on different hosts: each side's FIFO in its own host memory, a proxy thread on
    /// each side moving slices over the network.
    Net,
}

impl TransportKind {
    /// NCCL's choice for a peer: in-process when it is this process, shared memory when it is
    /// on this host, the network otherwise (see [`TransportKind::choose_with_p2p`] for GPUs).
    pub fn choose(same_process: bool, same_host: bool) -> TransportKind {
        Self::choose_with_p2p(same_process, same_host, false)
    }

    /// [`TransportKind::choose`], with P2P before shared memory when `p2p` (both ranks on GPUs
    /// that reach each other, P2P not disabled).
    pub fn choose_with_p2p(same_process: bool, same_host: bool, p2p: bool) -> TransportKind {
        match (same_process, same_host, p2p) {
            (true, _, _) => TransportKind::InProcess,
            (false, true, true) => TransportKind::P2p,
            (false, true, false) => TransportKind::Shm,
            (false, false, _) => TransportKind::Net,
        }
    }

    /// The transport's short name, for reports.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::InProcess => "in-process",
            TransportKind::P2p => "P2P",
            TransportKind::Shm => "SHM",
            TransportKind::Net => "NET",
        }
    }
}

/// Whether the switch variable `var` (`NCCL_P2P_DISABLE`'s kind) is set to something other
/// than `0` or empty.
pub(crate) fn flag_set(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| !v.trim().is_empty() && v.trim() != "0")
}

/// Sets up and attaches connection memory for one transport.
pub trait Transport {
    /// Receiver side: allocates a connection of `layout` and returns this side's memory and the
    /// handle for the sender. `key` names the connection uniquely in this communicator.
    fn listen(&self, layout: ConnLayout, key: u128) -> Result<(ConnMem, ConnHandle)>;
    /// Sender side: attaches to the receiver's connection from its handle, checking that it is
    /// a connection of `layout`.
    fn connect(&self, layout: ConnLayout, handle: &ConnHandle) -> Result<ConnMem>;
}

/// The transport of `kind` for a rank whose kernels run on `backend`; `None` for the network,
/// whose connections belong to a communicator's [`net::NetSetup`].
pub fn transport(kind: TransportKind, backend: &Arc<dyn Backend>) -> Option<Box<dyn Transport>> {
    match kind {
        TransportKind::InProcess => Some(Box::new(local::InProcess::new(backend.clone()))),
        TransportKind::P2p => Some(Box::new(p2p::P2p::new(backend.clone()))),
        TransportKind::Shm => Some(Box::new(shm::Shm::new(backend.clone()))),
        TransportKind::Net => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_of_both_sides_share_the_words_but_not_the_step() {
        let l = ConnLayout::simple(256);
        let (s, r) = (l.view(DevPtr(0x1000), Side::Send, 1), l.view(DevPtr(0x1000), Side::Recv, 0));
        assert_eq!((s.buff, s.head, s.tail, s.sizes_fifo), (r.buff, r.head, r.tail, r.sizes_fifo));
        assert_ne!(s.step, r.step);
        assert_eq!(s.head, DevPtr(0x1000 + 8 * 256));
        // Every word lies inside the connection.
        let end = 0x1000 + l.bytes().unwrap() as u64;
        for p in [s.head, s.tail, s.step, r.step] {
            assert!(p.0 + 8 <= end);
        }
        assert!(s.sizes_fifo.0 + 8 * NCCL_STEPS <= end);
        assert_eq!(l.view_ll(DevPtr(0x1000), Side::Send, 1), None);
    }

    #[test]
    fn the_ll_region_follows_the_simple_one_with_its_own_words() {
        let l = ConnLayout { step_bytes: 256, ll_step_bytes: 1024, ll128_step_bytes: 0 };
        let base = DevPtr(0x1000);
        let end = base.0 + l.bytes().unwrap() as u64;
        let simple = l.view(base, Side::Send, 1);
        let (s, r) = (l.view_ll(base, Side::Send, 1).unwrap(), l.view_ll(base, Side::Recv, 0).unwrap());
        // Past every word and signature of the Simple region, 16-byte aligned for LL lines.
        assert!(s.buff.0 >= simple.sig.0 + NCCL_STEPS * CALL_SIG_BYTES);
        assert_eq!(s.buff.0 % 16, 0);
        assert_eq!((s.buff, s.head, s.step_bytes), (r.buff, r.head, 1024));
        assert_ne!(s.step, r.step);
        assert_eq!(s.head, s.buff.offset(NCCL_STEPS * 1024));
        assert_eq!(s.sig.0 + NCCL_STEPS * CALL_SIG_BYTES, end, "the LL signatures end the connection");
        assert_eq!(l.view_ll128(base, Side::Send, 1), None);
    }

    #[test]
    fn the_ll128_region_follows_at_a_line_boundary_with_its_own_words() {
        let l = ConnLayout { step_bytes: 256, ll_step_bytes: 1024, ll128_step_bytes: 3840 };
        let base = DevPtr(0x1000);
        let end = base.0 + l.bytes().unwrap() as u64;
        let ll = l.view_ll(base, Side::Send, 1).unwrap();
        let (s, r) = (l.view_ll128(base, Side::Send, 1).unwrap(), l.view_ll128(base, Side::Recv, 0).unwrap());
        assert!(s.buff.0 >= ll.sig.0 + NCCL_STEPS * CALL_SIG_BYTES);
        assert!(s.buff.0.is_multiple_of(128));
        assert!(s.buff.0 - (ll.sig.0 + NCCL_STEPS * CALL_SIG_BYTES) < 128);
        assert_eq!((s.buff, s.head, s.step_bytes), (r.buff, r.head, 3840));
        assert_ne!(s.step, r.step);
        assert_eq!(s.sig.0 + NCCL_STEPS * CALL_SIG_BYTES, end, "the LL128 signatures end the connection");
        // Without LL the LL128 region follows the Simple one.
        let no_ll = ConnLayout { ll_step_bytes: 0, ..l };
        let s2 = no_ll.view_ll128(base, Side::Send, 1).unwrap();
        assert!(s2.buff.0 < s.buff.0 && s2.buff.0.is_multiple_of(128));
        assert_eq!(no_ll.view_ll(base, Side::Send, 1), None);
    }

    #[test]
    fn transports_are_chosen_as_nccl_chooses() {
        assert_eq!(TransportKind::choose(true, true), TransportKind::InProcess);
        assert_eq!(TransportKind::choose(false, true), TransportKind::Shm);
        assert_eq!(TransportKind::choose(false, false), TransportKind::Net);
        assert_eq!(TransportKind::choose_with_p2p(false, true, true), TransportKind::P2p);
        assert_eq!(TransportKind::choose_with_p2p(true, true, true), TransportKind::InProcess);
        assert_eq!(TransportKind::choose_with_p2p(false, false, true), TransportKind::Net);
    }
}

//! New communicators from an existing one: [`Comm::split`] (NCCL's `ncclCommSplit`: every
//! rank takes part) and [`Comm::shrink`] (NCCL's `ncclCommShrink`: the ranks that stay, without
//! the ones dropped, which may be dead). Both agree over this communicator's bootstrap on
//! direct connections (no ring through a dropped rank): the lowest rank of each new
//! communicator hosts its bootstrap root and sends the id to the others.
use super::communicator::Comm;
use super::config::CommConfig;
use crate::bootstrap::{Cancel, UniqueId};
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;

/// The bootstrap tag of split or shrink number `seq` (one counter for both, so their messages
/// never share a tag), for color `color`.
fn tag(seq: u64, color: u32) -> u64 {
    1 << 62 | seq << 32 | color as u64
}

impl Comm {
    /// Splits this communicator (NCCL's `ncclCommSplit`): every rank calls it; ranks that pass
    /// the same `color` form a new communicator of `cfg`, numbered by `key` (ties by their rank
    /// here); a rank that passes `None` (NCCL's `NCCL_SPLIT_NOCOLOR`) joins none and gets
    /// `None`. The lowest rank of each color hosts the new bootstrap root and sends its id to
    /// the others over this communicator's bootstrap.
    pub fn split(&self, color: Option<u32>, key: i64, cfg: CommConfig) -> Result<Option<Comm>> {
        let seq = self.splits.fetch_add(1, Ordering::SeqCst);
        let mut mine = Vec::with_capacity(17);
        mine.push(color.is_some() as u8);
        mine.extend_from_slice(&color.unwrap_or(0).to_le_bytes());
        mine.extend_from_slice(&key.to_le_bytes());
        let mut boot = self.bootstrap.lock().unwrap_or_else(|e| e.into_inner());
        let all = boot.all_gather(&mine)?;
        let decode = |b: &[u8]| -> Result<(Option<u32>, i64)> {
            if b.len() != 13 {
                return Err(Error::InvalidConfig(format!(
                    "split: a peer sent {} bytes, expected 13",
                    b.len()
                )));
            }
            let c = u32::from_le_bytes(b[1..5].try_into().expect("4 bytes"));
            Ok(((b[0] != 0).then_some(c), i64::from_le_bytes(b[5..13].try_into().expect("8 bytes"))))
        };
        let entries: Vec<(Option<u32>, i64)> = all.iter().map(|b| decode(b)).collect::<Result<_>>()?;
        let Some(color) = color else { return Ok(None) };
        let mut members: Vec<usize> = (0..self.nranks).filter(|&r| entries[r].0 == Some(color)).collect();
        members.sort_by_key(|&r| (entries[r].1, r));
        let new_rank = members.iter().position(|&r| r == self.rank).expect("this rank has its color");
        let (id, _) = self.hand_out_id(&mut boot, &members, tag(seq, color), &[])?;
        drop(boot);
        self.init_child(members.len(), new_rank, &id, cfg).map(Some)
    }

    /// Drops the ranks in `exclude` (NCCL's `ncclCommShrink`): every other rank calls it with
    /// the same list — the dropped ranks do not (they may have died) — and together they form a
    /// new communicator of `cfg`, numbered in this one's order. With `abort_in_flight` (NCCL's
    /// `NCCL_SHRINK_ABORT`) a call of this rank still in flight is stopped first (it waited on a
    /// dropped rank, say); otherwise it is waited for. An empty list is a copy of this
    /// communicator. Refused, naming the entry, when the list names a rank out of range, this
    /// rank or a rank twice, or differs from the list the lowest remaining rank passed.
    ///
    /// ```
    /// use rsccl::{backend, Comm, CommConfig};
    /// let be = backend::cpu();
    /// let comms = Comm::init_all(&be, 3, CommConfig::default())?;
    /// // Rank 1 is dropped; ranks 0 and 2 become ranks 0 and 1 of the new communicator.
    /// let kept: Vec<Comm> = std::thread::scope(|s| {
    ///     let hs: Vec<_> = [0, 2].map(|r| {
    ///         let c = &comms[r];
    ///         s.spawn(move || c.shrink(&[1], false, CommConfig::default()))
    ///     }).into();
    ///     hs.into_iter().map(|h| h.join().unwrap()).collect::<Result<_, _>>()
    /// })?;
    /// assert_eq!((kept[1].rank(), kept[1].nranks()), (1, 2));
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn shrink(&self, exclude: &[usize], abort_in_flight: bool, cfg: CommConfig) -> Result<Comm> {
        let refused = |what: String| Error::InvalidConfig(format!("rank {}: shrink: {what}", self.rank));
        let mut dropped = vec![false; self.nranks];
        for (i, &r) in exclude.iter().enumerate() {
            match dropped.get(r) {
                None => return Err(refused(format!("entry {i} names rank {r}, not below {}", self.nranks))),
                Some(true) => return Err(refused(format!("entry {i} names rank {r} a second time"))),
                Some(false) if r == self.rank => {
                    return Err(refused(format!(
                        "entry {i} names this rank: a dropped rank does not call it"
                    )))
                }
                Some(false) => dropped[r] = true,
            }
        }
        let seq = self.splits.fetch_add(1, Ordering::SeqCst);
        if abort_in_flight {
            // The call in flight stops at once (its waits give up); its failure is its own.
            self.health.abort.store_u32(0, 1)?;
        }
        self.complete_in_flight(&mut self.queue.lock().unwrap_or_else(|p| p.into_inner()));
        let members: Vec<usize> = (0..self.nranks).filter(|&r| !dropped[r]).collect();
        let new_rank = members.iter().position(|&r| r == self.rank).expect("this rank stays");
        let leader = members[0];
        // The leader's list goes with the id: every rank checks it agrees.
        let list: Vec<u8> = members.iter().flat_map(|&r| (r as u64).to_le_bytes()).collect();
        let mut boot = self.bootstrap.lock().unwrap_or_else(|e| e.into_inner());
        let (id, theirs) = self.hand_out_id(&mut boot, &members, tag(seq, u32::MAX), &list)?;
        if theirs != list {
            let theirs: Vec<u64> =
                theirs.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))).collect();
            return Err(refused(format!(
                "rank {leader} keeps ranks {theirs:?}, this rank {members:?}: every remaining rank passes the same list"
            )));
        }
        drop(boot);
        tracing::info!(rank = self.rank, "shrink: ranks {members:?} stay, as ranks 0..{}", members.len());
        self.init_child(members.len(), new_rank, &id, cfg)
    }

    /// The new communicator's init, stopped by an abort of this one while it runs (NCCL's
    /// `childAbortFlag`): a member that never comes no longer holds the caller for the whole
    /// bootstrap timeout after the parent was aborted.
    fn init_child(&self, nranks: usize, rank: usize, id: &UniqueId, cfg: CommConfig) -> Result<Comm> {
        let cancel = Cancel::linked_to(&self.health.cancel);
        let child = Comm::init_rank_cancellable(&self.backend, nranks, rank, id, cfg, &cancel);
        cancel.unlink();
        child
    }

    /// The id of a new communicator of `members` (this rank among them), under bootstrap tag
    /// `tag`: the lowest member starts its root on this rank's address and sends the id, with
    /// `extra`, to each other member; the others receive it. Returns the id and the `extra` the
    /// lowest member sent (this rank's own on the lowest).
    fn hand_out_id(
        &self,
        boot: &mut crate::bootstrap::Bootstrap,
        members: &[usize],
        tag: u64,
        extra: &[u8],
    ) -> Result<(UniqueId, Vec<u8>)> {
        let leader = *members.iter().min().expect("this rank is a member");
        if leader == self.rank {
            let id = UniqueId::with_addr(std::net::SocketAddr::new(self.peers[self.rank].addr.ip(), 0))?;
            let msg = [id.to_bytes().as_slice(), extra].concat();
            for &r in members.iter().filter(|&&r| r != self.rank) {
                boot.send(r, tag, &msg)?;
            }
            return Ok((id, extra.to_vec()));
        }
        let msg = boot.recv(leader, tag).map_err(|e| {
            Error::InvalidConfig(format!(
                "rank {}: the id of the new communicator from rank {leader}, its lowest rank, never came: {e}",
                self.rank
            ))
        })?;
        let Some((id, theirs)) = msg.split_at_checked(UniqueId::BYTES) else {
            return Err(Error::InvalidConfig(format!(
                "rank {}: rank {leader} sent {} bytes for a new communicator's id, expected at least {}",
                self.rank,
                msg.len(),
                UniqueId::BYTES
            )));
        };
        Ok((UniqueId::from_bytes(id)?, theirs.to_vec()))
    }
}

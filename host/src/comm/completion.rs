//! Completion and failure diagnosis: waiting for a call's kernel, reading its channels'
//! status words, and naming the cause of a failure (a dead or departed peer, a mismatched call,
//! a broken connection, a hang, with every rank's answer).
use super::communicator::{Comm, Ended, FlightId, InFlight, KernelFlight, Queue, STATUS_TIMEOUT};
use super::hang;
use super::pool::Pooled;
use super::signature::describe;
use super::RankFailure;
use crate::backend::DeviceBuffer;
use crate::error::{Error, Result};
use crate::transport::net::proxy::Proxy;
use rsccl_device::prims::conn::{decode_status, mismatch_offset, CallSig, ErrorCode, CALL_SIG_BYTES};

/// What a kernel whose failures are being diagnosed was running, for the report on a timeout.
pub(super) enum Awaiting<'a> {
    /// Nothing a report can name.
    Nothing,
    /// Collective number `.0`, [`hang::op_code`] `.1` (the hang report), its signature `.2`
    /// (what a mismatch report names as this rank's call).
    Collective(u64, u64, CallSig),
    /// Point-to-point group `group` (this rank's number): `stuck` names the operations the
    /// failed blocks ran, and the report says where their peers are.
    P2p {
        /// The group's number on this rank.
        group: u64,
        /// The operations behind the given failures, as users name them.
        stuck: &'a dyn Fn(&[RankFailure]) -> Vec<String>,
    },
}

impl Comm {
    /// Waits for this rank's ring, tree or NVLS kernel and reports its failures, naming the
    /// peers it waited for and any rank whose process has died.
    /// `sig`: the call's signature, as its launch returned it.
    pub(crate) fn finish(&self, sig: CallSig) -> Result<()> {
        self.finish_with(&self.tables.status, self.cfg.nchannels, sig)
    }

    /// Waits for the collective `f` and reports its failures as what runs it reports them.
    pub(super) fn finish_flight(&self, f: InFlight, ended: Ended) -> Result<()> {
        match f {
            InFlight::Kernel(k) => self.finish_kernel(k, ended),
            InFlight::Msccl(_, sig, l) => self.finish_msccl(&l, sig),
            InFlight::NvlsTree(seq, worker) => {
                let r = worker.join().unwrap_or_else(|_| {
                    Err(Error::InvalidConfig(format!("rank {}: the NVLS_TREE worker panicked", self.rank)))
                });
                self.health.progress.finish(seq);
                r
            }
            InFlight::Group { finish, .. } => finish(self, ended),
        }
    }

    /// Waits for kernel `k` (and those before it) and reports its failures, naming the call
    /// in the reports; its status area goes back to the pool zeroed.
    fn finish_kernel(&self, k: KernelFlight, ended: Ended) -> Result<()> {
        let res = self.finish_inner(
            Awaiting::Collective(k.seq, k.what, k.sig),
            &k.status,
            self.cfg.nchannels,
            ended,
        );
        if res.is_ok() {
            self.health.progress.finish(k.seq);
        } else {
            self.health.progress.fail(k.seq);
        }
        self.recycle_status(k.status, res.is_err());
        res
    }

    /// Gives a status area of the status pool back once its kernel ended: as it is where the
    /// kernel failed nowhere (its status words and records are still zero), else zeroed first,
    /// or freed where it cannot be.
    pub(super) fn recycle_status(&self, status: Pooled, failed: bool) {
        if failed && self.stream.copy_in(&status, 0, &vec![0u8; status.len()]).is_err() {
            status.discard();
        }
    }

    /// [`Comm::finish`] for a kernel that reports in `words` status words of `status` (one per
    /// block), signed `sig`.
    pub(super) fn finish_with(&self, status: &DeviceBuffer, words: usize, sig: CallSig) -> Result<()> {
        let current = self.health.progress.in_flight();
        let awaiting = current.map_or(Awaiting::Nothing, |(seq, what)| Awaiting::Collective(seq, what, sig));
        let res = self.finish_inner(awaiting, status, words, Ended::Unknown);
        if let Some((seq, _)) = current {
            if res.is_ok() {
                self.health.progress.finish(seq);
            } else {
                self.health.progress.fail(seq);
            }
        }
        res
    }

    /// Whether no kernel of this rank recorded a failure since its abort word was armed and
    /// nothing stopped them: then every status area of the kernels that ended is still zero,
    /// and none need be read back (a device-to-host copy each on a GPU). The one writer of
    /// status words, `PrimsStatus::record`, also sets the word's failed byte, every kernel
    /// that reports in a status area is given the word, and the host clears it only with no
    /// call in flight. Call once the kernels ended.
    pub(super) fn failed_nowhere(&self) -> bool {
        self.health.abort.load_u32(0).is_ok_and(|w| w == 0)
    }

    /// Asks every rank where it is and reports on collective `seq` (`what`): the hang report.
    pub(super) fn ask_ranks(&self, seq: u64, what: u64) -> (String, Vec<String>) {
        hang::report(self.rank, seq, what, &self.status_answers())
    }

    /// Every rank's answer to "where are you" (its progress words), or why it gave none.
    fn status_answers(&self) -> Vec<std::result::Result<Vec<u8>, String>> {
        self.bootstrap.lock().unwrap_or_else(|e| e.into_inner()).query_status(STATUS_TIMEOUT)
    }

    /// Synchronizes the stream unless the kernels being completed are known to have ended.
    pub(super) fn kernels_ended(&self, ended: Ended) -> Result<()> {
        match ended {
            Ended::Unknown => self.stream.synchronize(),
            Ended::Seen => Ok(()),
        }
    }

    /// [`Comm::finish`] for what runs (`current`).
    pub(super) fn finish_inner(
        &self,
        current: Awaiting,
        status: &DeviceBuffer,
        nwords: usize,
        ended: Ended,
    ) -> Result<()> {
        if let Err(e) = self.kernels_ended(ended) {
            return Err(self.fail(Error::Rank { rank: self.rank, source: Box::new(e) }));
        }
        if self.nranks == 1 || self.failed_nowhere() {
            return Ok(());
        }
        let mut words = vec![0u8; 8 * nwords];
        self.stream.copy_out(status, 0, &mut words)?;
        let failures: Vec<RankFailure> = words
            .chunks_exact(8)
            .enumerate()
            .filter_map(|(c, w)| {
                let (code, peer, step) = decode_status(u64::from_le_bytes(w.try_into().expect("8 bytes")));
                (code != ErrorCode::None).then_some(RankFailure {
                    rank: self.rank,
                    channel: c,
                    code,
                    peer: peer as usize,
                    step,
                })
            })
            .collect();
        if failures.is_empty() {
            return Ok(());
        }
        // Another rank told this one why it stopped (through the abort word): the cause.
        if let Some(e) = self.told_failure() {
            return Err(e);
        }
        // A peer process of this host that died, or a rank of this process that left, stopped
        // this kernel (through the abort word): it is the answer. Ranks that left after this
        // kernel gave up on its own are a consequence, not the cause (the hang report below).
        if failures.iter().any(|f| f.code == ErrorCode::Aborted) {
            self.check_peers_here(&failures)?;
        }
        // A call that another rank's does not match: name both.
        if failures.iter().any(|f| f.code == ErrorCode::Mismatch) {
            let mut rec = vec![0u8; CALL_SIG_BYTES as usize * nwords];
            self.stream.copy_out(status, mismatch_offset(nwords as u64) as usize, &mut rec)?;
            let records: &[CallSig] = bytemuck::cast_slice(&rec);
            let mine = match current {
                Awaiting::Collective(_, _, sig) => sig,
                _ => CallSig::default(),
            };
            let mut peers: Vec<(usize, Option<(u64, String)>)> = Vec::new();
            for f in failures.iter().filter(|f| f.code == ErrorCode::Mismatch) {
                let theirs =
                    records.get(f.channel).filter(|r| r.seq != 0).map(|r| (r.seq, describe(r.desc, r.count)));
                if !peers.iter().any(|(p, t)| *p == f.peer && t.is_some() >= theirs.is_some()) {
                    peers.retain(|(p, _)| *p != f.peer);
                    peers.push((f.peer, theirs));
                }
            }
            peers.sort_by_key(|(p, _)| *p);
            return Err(self.fail(Error::CallMismatch {
                rank: self.rank,
                seq: mine.seq,
                mine: describe(mine.desc, mine.count),
                peers,
            }));
        }
        // A broken network connection names its peer and host; the other ranks' states say
        // whether that peer left because someone else never came.
        if let Some(mut e) = self.links.proxy.as_ref().and_then(Proxy::failure) {
            if let (Error::PeerLost { report, .. }, Awaiting::Collective(seq, what, _)) = (&mut e, &current) {
                *report = Some(self.ask_ranks(*seq, *what).0);
            }
            return Err(self.fail(e));
        }
        // A dead process this rank waited on is the answer; ranks that died after failing
        // elsewhere are not (the hang report below lists them as unreachable).
        let dead: Vec<(usize, u32)> = self
            .peers
            .iter()
            .filter(|p| {
                p.rank != self.rank
                    && failures.iter().any(|f| f.peer == p.rank)
                    && p.host_hash == self.peers[self.rank].host_hash
                    && !super::watchdog::alive(p.pid)
            })
            .map(|p| (p.rank, p.pid))
            .collect();
        if !dead.is_empty() {
            return Err(self.fail(Error::PeerDied { rank: self.rank, dead, failures }));
        }
        // A wait timed out and nobody is known dead: ask every rank where it is.
        let timed_out = failures.iter().any(|f| {
            matches!(f.code, ErrorCode::RecvTimeout | ErrorCode::SendTimeout | ErrorCode::DependencyTimeout)
        });
        match (timed_out, current) {
            (true, Awaiting::Collective(seq, what, _)) => {
                let (headline, ranks) = self.ask_ranks(seq, what);
                tracing::warn!(rank = self.rank, "hang report: {headline}");
                for l in &ranks {
                    tracing::warn!(rank = self.rank, "hang report: {l}");
                }
                return Err(self.fail(Error::Hang { rank: self.rank, headline, ranks, failures }));
            }
            (true, Awaiting::P2p { group, stuck }) => {
                let mut waited: Vec<usize> = failures.iter().map(|f| f.peer).collect();
                waited.sort_unstable();
                waited.dedup();
                let mut peers = hang::p2p_lines(&waited, &self.status_answers());
                // A peer that left (dropped or aborted its communicator) says so.
                let left = super::departure::left(self.links.conn_key, self.rank, u64::MAX);
                for (line, r) in peers.iter_mut().zip(&waited) {
                    if let Some(d) = left.iter().find(|d| d.rank == *r) {
                        match &d.why {
                            Some(why) => line.push_str(&format!("; it left the communicator: {why}")),
                            None => line.push_str("; it left the communicator (dropped or aborted it)"),
                        }
                    }
                }
                let stuck = stuck(&failures);
                return Err(self.fail(Error::P2pTimeout { rank: self.rank, group, stuck, peers, failures }));
            }
            _ => {}
        }
        Err(self.fail(Error::Collective { failures }))
    }

    /// `Err` naming the peer processes of this host that died, or the ranks of this process that
    /// left this communicator, if any (`failures`: what this rank's channels reported).
    pub(super) fn check_peers_here(&self, failures: &[RankFailure]) -> Result<()> {
        // The call this rank is in (or about to enter): peers that left before finishing it.
        let seq = self.health.progress.in_flight().map_or(self.health.progress.done() + 1, |(s, _)| s);
        self.check_peers_at(failures, seq)
    }

    /// [`Comm::check_peers_here`] for collective `seq`.
    pub(super) fn check_peers_at(&self, failures: &[RankFailure], seq: u64) -> Result<()> {
        let dead = self.health.watchdog.as_ref().map(super::watchdog::Watchdog::dead).unwrap_or_default();
        if !dead.is_empty() {
            return Err(self.fail(Error::PeerDied { rank: self.rank, dead, failures: failures.to_vec() }));
        }
        let left = super::departure::left(self.links.conn_key, self.rank, seq);
        if left.is_empty() {
            return Ok(());
        }
        // The ranks after this one may wait on it: they hear it from here.
        for d in &left {
            self.health.relay.pass_on(d);
        }
        let left = left.into_iter().map(|d| (d.rank, d.why)).collect();
        Err(self.fail(Error::PeerLeft { rank: self.rank, left }))
    }

    /// Waits for every call in flight and reports each, oldest first, keeping the results for
    /// their works (detached calls' failures reach [`Comm::async_error`] only). A call behind
    /// one that failed fails too, whatever its status words say: the failure stopped it
    /// through the abort word, or left the connections it ran on inconsistent.
    pub(super) fn complete_in_flight(&self, q: &mut Queue) {
        self.complete_rest(q, false);
    }

    /// [`Comm::complete_in_flight`]; `failed`: a call completed before them failed.
    fn complete_rest(&self, q: &mut Queue, mut failed: bool) {
        while let Some(f) = q.flights.pop_front() {
            let id = f.id();
            let mut r = self.finish_flight(f, Ended::Unknown);
            if failed && r.is_ok() {
                r = Err(self.earlier_failure());
            }
            failed |= r.is_err();
            Self::keep_result(q, id, r);
        }
    }

    /// Keeps call `id`'s result for its work (a detached call's is dropped: its failure is
    /// recorded for [`Comm::async_error`]).
    fn keep_result(q: &mut Queue, id: FlightId, r: Result<()>) {
        match q.detached.iter().position(|d| *d == id) {
            Some(i) => {
                q.detached.swap_remove(i);
            }
            None => q.unclaimed.push((id, r)),
        }
    }

    /// Completes the calls in flight oldest first through call `until`, each once its done
    /// flag is set, leaving those behind it in flight (NCCL's wait on one call's event): on a
    /// GPU the stream is not synchronized, which would wait for every later call. Where that
    /// cannot be — a call with no flag, a backend error, a failure (the calls behind it fail
    /// with it) — every call in flight is completed.
    pub(super) fn complete_through(&self, q: &mut Queue, until: FlightId) {
        while let Some(front) = q.flights.front() {
            let id = front.id();
            if !front.done().is_some_and(super::done::DoneFlag::wait) {
                break;
            }
            let f = q.flights.pop_front().expect("a front");
            let r = self.finish_flight(f, Ended::Seen);
            let failed = r.is_err();
            Self::keep_result(q, id, r);
            if failed {
                return self.complete_rest(q, true);
            }
            if id == until {
                return;
            }
        }
        self.complete_in_flight(q);
    }

    /// The error of a call enqueued behind one that failed: the first failure recorded.
    fn earlier_failure(&self) -> Error {
        let recorded = self.health.failure.lock().unwrap_or_else(|e| e.into_inner()).clone();
        self.fail(recorded.unwrap_or_else(|| {
            Error::InvalidConfig(format!("rank {}: a call enqueued before this one failed", self.rank))
        }))
    }
}

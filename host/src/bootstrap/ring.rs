//! The collectives over the bootstrap ring (all-gather, barrier, broadcast) and the intra-node
//! broadcast. Each call's messages are tagged with the call's number, so a rank that runs ahead
//! into the next call never mixes its messages into this one.
use super::msg::Lane;
use super::{Bootstrap, BootstrapError};
use crate::Result;
use std::time::Instant;

impl Bootstrap {
    /// Every rank's `data` (at most [`MAX_BOOTSTRAP_MSG`](super::MAX_BOOTSTRAP_MSG) bytes each,
    /// lengths may differ), in rank order — NCCL's `bootstrapAllGather`: `nranks - 1` steps
    /// around the ring, each passing one rank's block to the successor.
    pub fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        Self::check_len("all_gather data", data.len())?;
        let (n, r) = (self.nranks, self.rank);
        let (next, prev) = (self.next(), self.prev());
        let tag = self.next_ring_tag();
        let deadline = Instant::now() + self.timeout;
        let mut out = vec![Vec::new(); n];
        out[r] = data.to_vec();
        for step in 0..n - 1 {
            let send = (r + n - step) % n;
            let block = std::mem::take(&mut out[send]);
            let sent = self.send_on("all_gather", Lane::Ring, next, tag, &block, deadline);
            out[send] = block;
            sent?;
            out[(r + n - step - 1) % n] = self.recv_on("all_gather", Lane::Ring, prev, tag, deadline)?;
        }
        Ok(out)
    }

    /// Returns once every rank has called it (an all-gather of nothing).
    pub fn barrier(&mut self) -> Result<()> {
        self.all_gather(&[]).map(drop)
    }

    /// `root`'s `data` (at most [`MAX_BOOTSTRAP_MSG`](super::MAX_BOOTSTRAP_MSG) bytes) on every
    /// rank; the other ranks' `data` is ignored. Passed around the ring from `root`.
    pub fn broadcast(&mut self, root: usize, data: &[u8]) -> Result<Vec<u8>> {
        self.check_peer("broadcast root", root)?;
        let next = self.next();
        let tag = self.next_ring_tag();
        let deadline = Instant::now() + self.timeout;
        let got = if self.rank == root {
            Self::check_len("broadcast data", data.len())?;
            data.to_vec()
        } else {
            let prev = self.prev();
            self.recv_on("broadcast", Lane::Ring, prev, tag, deadline)?
        };
        if next != root {
            self.send_on("broadcast", Lane::Ring, next, tag, &got, deadline)?;
        }
        Ok(got)
    }

    /// `root`'s `data` on every rank of `root`'s host, as NCCL's `bootstrapIntraNodeBroadcast`:
    /// called by every rank in [`local_ranks`](Self::local_ranks) (which must hold `root`); the
    /// root sends to each of them directly. Other ranks' `data` is ignored.
    pub fn intra_node_broadcast(&mut self, root: usize, data: &[u8]) -> Result<Vec<u8>> {
        self.check_peer("intra-node broadcast root", root)?;
        if !self.local.contains(&root) {
            return Err(BootstrapError::InvalidArgument(format!(
                "intra-node broadcast root {root} is not on the host of rank {} ({})",
                self.rank, self.peers[self.rank].hostname
            ))
            .into());
        }
        self.intra_seq += 1;
        let tag = self.intra_seq;
        let deadline = Instant::now() + self.timeout;
        if self.rank != root {
            return self.recv_on("intra-node broadcast", Lane::Intra, root, tag, deadline);
        }
        Self::check_len("intra-node broadcast data", data.len())?;
        for i in 0..self.local.len() {
            let peer = self.local[i];
            if peer != root {
                self.send_on("intra-node broadcast", Lane::Intra, peer, tag, data, deadline)?;
            }
        }
        Ok(data.to_vec())
    }

    fn next_ring_tag(&mut self) -> u64 {
        self.ring_seq += 1;
        self.ring_seq
    }
}

//! A rank's NVLS memory (NCCL's layout): the one-shot windows, then the FIFO form's buffers,
//! credit words and saved steps of each head in its scratch and flags, and the channel tables
//! built from them.
use crate::error::{Error, Result};
use rsccl_device::coll::nvls_fifo::{NvlsChannel, MAX_NVLS_ARITY, NO_HEAD};
use rsccl_device::prims::conn::{ConnInfo, CALL_SIG_BYTES, CONN_NVLS_MIN_POLL, NCCL_STEPS};
use rsccl_device::DevPtr;

/// Bytes of one one-shot slice: per block and rank, the unit a barrier moves.
pub const NVLS_SLICE_BYTES: u64 = 32 << 10;

/// Largest NVLS FIFO slot (NCCL's default `nvlsChunkSize`); a communicator with smaller steps
/// uses its own step size.
pub const NVLS_STEP_BYTES: u64 = 128 << 10;

/// Bytes of one FIFO's credit words (NCCL's `memSize`): the head at 0, the tail at half.
const NVLS_CREDIT_BYTES: u64 = 64;

/// Where the FIFO form's buffers, credit words and saved steps lie (NCCL's layout; see
/// [`Nvls`]). The one definition the host builds connections from.
#[derive(Clone, Copy, Debug)]
pub(super) struct FifoLayout {
    pub(super) nheads: u64,
    pub(super) nch: u64,
    pub(super) step_bytes: u64,
    /// Scratch offset of the first FIFO (after the one-shot windows).
    pub(super) fifo_base: u64,
    /// Flags offset of the first credit words (after the barrier words).
    pub(super) credit_base: u64,
}

/// FIFO direction: every rank's slice towards the head (reduce), or the head's result back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    Reduce = 0,
    Bcast = 1,
}

impl FifoLayout {
    /// The layout for `nheads` heads (≤ [`MAX_NVLS_ARITY`]) and `nch` channels (≤ the
    /// communicator's limit), with slots of `step_bytes` capped at [`NVLS_STEP_BYTES`].
    pub(super) fn new(nheads: usize, nch: usize, step_bytes: u64) -> Result<Self> {
        let step_bytes = step_bytes.min(NVLS_STEP_BYTES) / 16 * 16;
        if nheads == 0 || nheads > MAX_NVLS_ARITY || nch == 0 || step_bytes == 0 {
            return Err(Error::InvalidConfig(format!(
                "NVLS: {nheads} heads, {nch} channels, {step_bytes}-byte slots"
            )));
        }
        let (nheads, nch) = (nheads as u64, nch as u64);
        let round = |b: u64| b.div_ceil(NVLS_CREDIT_BYTES) * NVLS_CREDIT_BYTES;
        Ok(FifoLayout {
            nheads,
            nch,
            step_bytes,
            fifo_base: round(nch * nheads * NVLS_SLICE_BYTES),
            credit_base: round(nch * nheads * 8),
        })
    }

    /// The index of head `h`'s FIFO of `dir` in channel `c`.
    fn index(&self, h: u64, c: u64, dir: Dir) -> u64 {
        (h * 2 + dir as u64) * self.nch + c
    }

    pub(super) fn buff_bytes(&self) -> u64 {
        NCCL_STEPS * self.step_bytes
    }

    pub(super) fn scratch_bytes(&self) -> u64 {
        self.fifo_base + 2 * self.nheads * self.nch * self.buff_bytes()
    }

    /// Flags offset of the call signatures (after the credit words).
    pub(super) fn sig_base(&self) -> u64 {
        self.credit_base + 2 * self.nheads * self.nch * NVLS_CREDIT_BYTES
    }

    pub(super) fn flag_bytes(&self) -> u64 {
        self.sig_base() + self.nch * self.nheads * 2 * CALL_SIG_BYTES
    }

    /// Saved-step words: per channel one per head and direction, and the head's two.
    pub(super) fn step_words(&self) -> u64 {
        self.nch * (2 * self.nheads + 2)
    }

    /// One connection to head `h`'s FIFO of `dir` in channel `c`, from the scratch and flags
    /// bases given (unicast or multicast), saving its step in word `step` of `steps`.
    fn conn(
        &self,
        (scratch, flags): (DevPtr, DevPtr),
        h: u64,
        c: u64,
        dir: Dir,
        steps: DevPtr,
        step: u64,
    ) -> ConnInfo {
        let i = self.index(h, c, dir);
        let credit = flags.offset(self.credit_base + i * NVLS_CREDIT_BYTES);
        ConnInfo {
            buff: scratch.offset(self.fifo_base + i * self.buff_bytes()),
            head: credit,
            tail: credit.offset(NVLS_CREDIT_BYTES / 2),
            step: steps.offset(8 * step),
            sizes_fifo: DevPtr::NULL,
            // Calls are checked once per block for all ranks (`coll::nvls`), not per FIFO.
            sig: DevPtr::NULL,
            step_bytes: self.step_bytes,
            flags: 0,
            peer: h,
        }
    }

    /// Channel `c` of rank `me` (head `me`): its unicast connections to every head, and as
    /// head the multicast ones (polled for the minimum, NCCL's `NCCL_NVLS_MIN_POLL`).
    pub(super) fn channel(
        &self,
        c: usize,
        me: usize,
        uc: (DevPtr, DevPtr),
        mc: (DevPtr, DevPtr),
        steps: DevPtr,
    ) -> NvlsChannel {
        let (c, me, nh) = (c as u64, me as u64, self.nheads);
        let base = c * (2 * nh + 2);
        let mut ch = NvlsChannel { nheads: nh, head_rank: NO_HEAD, ..NvlsChannel::default() };
        for h in 0..nh {
            ch.up_send[h as usize] = self.conn(uc, h, c, Dir::Reduce, steps, base + h);
            ch.up_recv[h as usize] = self.conn(uc, h, c, Dir::Bcast, steps, base + nh + h);
        }
        if me < nh {
            ch.head_rank = me;
            let min_poll = |conn: ConnInfo| ConnInfo { flags: CONN_NVLS_MIN_POLL, ..conn };
            ch.down_recv = min_poll(self.conn(mc, me, c, Dir::Reduce, steps, base + 2 * nh));
            ch.down_send = min_poll(self.conn(mc, me, c, Dir::Bcast, steps, base + 2 * nh + 1));
        }
        ch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every FIFO, credit pair and saved step of every rank's channels lies inside its buffer,
    /// clear of the one-shot windows, barrier words and signatures and of each other; the head's two
    /// connections are the multicast ones, polled for the minimum.
    #[test]
    fn fifo_layout_gives_every_connection_its_own_memory() {
        let (uc, mc, steps) =
            ((DevPtr(1 << 40), DevPtr(2 << 40)), (DevPtr(3 << 40), DevPtr(4 << 40)), DevPtr(5 << 40));
        for nheads in 3..=MAX_NVLS_ARITY {
            for nch in [1usize, 2, 5] {
                let l = FifoLayout::new(nheads, nch, 8192).unwrap();
                let (mut buffs, mut credits, mut words) = (Vec::new(), Vec::new(), Vec::new());
                for me in 0..nheads {
                    for c in 0..nch {
                        let ch = l.channel(c, me, uc, mc, steps);
                        assert_eq!((ch.nheads, ch.head_rank), (nheads as u64, me as u64));
                        let ups = ch.up_send[..nheads].iter().chain(&ch.up_recv[..nheads]);
                        for (k, conn) in ups.enumerate() {
                            assert_eq!((conn.flags, conn.peer), (0, (k % nheads) as u64));
                            if me == 0 {
                                buffs.push(conn.buff.0 - uc.0 .0);
                                credits.push(conn.head.0 - uc.1 .0);
                                assert_eq!(conn.tail.0 - conn.head.0, NVLS_CREDIT_BYTES / 2);
                            }
                            words.push((me, conn.step.0));
                        }
                        for (dir, conn) in [(Dir::Reduce, ch.down_recv), (Dir::Bcast, ch.down_send)] {
                            assert_eq!(conn.flags, CONN_NVLS_MIN_POLL);
                            let own = l.conn(uc, me as u64, c as u64, dir, steps, 0);
                            assert_eq!(conn.buff.0 - mc.0 .0, own.buff.0 - uc.0 .0);
                            assert_eq!(conn.tail.0 - mc.1 .0, own.tail.0 - uc.1 .0);
                            words.push((me, conn.step.0));
                        }
                        assert!(ch.up_send[nheads..].iter().all(|c| !c.is_connected()));
                    }
                }
                let fifos = 2 * nheads * nch;
                for (list, base, size, end) in [
                    (&mut buffs, l.fifo_base, l.buff_bytes(), l.scratch_bytes()),
                    (&mut credits, l.credit_base, NVLS_CREDIT_BYTES, l.sig_base()),
                ] {
                    list.sort_unstable();
                    assert_eq!(list.len(), fifos);
                    assert!(list[0] >= base && list[fifos - 1] + size <= end);
                    assert!(list.windows(2).all(|w| w[1] - w[0] >= size), "{nheads} heads, {nch} channels");
                }
                assert!(l.fifo_base >= (nch * nheads) as u64 * NVLS_SLICE_BYTES);
                assert!(l.credit_base >= (nch * nheads * 8) as u64);
                // Two signature slots per block and rank, after the credits.
                assert_eq!(l.flag_bytes() - l.sig_base(), (nch * nheads * 2) as u64 * CALL_SIG_BYTES);
                words.sort_unstable();
                words.dedup();
                assert_eq!(words.len(), nheads * l.step_words() as usize);
                assert!(words.iter().all(|&(_, w)| w >= steps.0 && w < steps.0 + 8 * l.step_words()));
            }
        }
        // Slots never exceed NCCL's chunk, and nonsense shapes are refused.
        assert_eq!(FifoLayout::new(4, 2, 1 << 20).unwrap().step_bytes, NVLS_STEP_BYTES);
        assert!(FifoLayout::new(MAX_NVLS_ARITY + 1, 1, 8192).is_err());
        assert!(FifoLayout::new(4, 0, 8192).is_err());
        assert!(FifoLayout::new(4, 1, 8).is_err());
    }
}

//! A receiver that refused a point-to-point send over the network tells the sender: its
//! kernel cannot see the refusal (the sending proxy credits a step once its bytes went out),
//! so without this notice its send would end `Ok`. The notice rides the bootstrap connections
//! ([`Lane::Refused`](super::msg::Lane::Refused)) and is handed by the listener's reader thread
//! to the hook the communicator installed, which records the failure and stops its kernels.
use super::depart::cut;
use super::wire::{Dec, Enc, FrameError};
use std::sync::Arc;

/// Most bytes of the receiver's account of its receive.
pub const MAX_RECEIVE_TEXT_BYTES: usize = 512;

/// Rank `receiver` refused the send it matched as operation `seq` of its connection from this
/// rank: the send carried `sent` bytes, and the receive it posted is `receive` (its words).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The rank that refused.
    pub receiver: usize,
    /// The operation's number on the connection (the same on both sides).
    pub seq: u64,
    /// Bytes the send carried.
    pub sent: u64,
    /// The receive, as the receiver's error names it.
    pub receive: String,
}

impl Refusal {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.usize(self.receiver)
            .u64(self.seq)
            .u64(self.sent)
            .bytes(cut(&self.receive, MAX_RECEIVE_TEXT_BYTES).as_bytes());
        e.0
    }

    pub(crate) fn decode(b: &[u8], nranks: usize) -> Result<Refusal, FrameError> {
        let mut d = Dec::new(b);
        let (receiver, seq, sent) = (d.usize()?, d.u64()?, d.u64()?);
        let text = d.bytes()?;
        d.finish()?;
        if text.len() > MAX_RECEIVE_TEXT_BYTES {
            return Err(FrameError::Malformed("refused receive's text too long"));
        }
        if receiver >= nranks {
            return Err(FrameError::Malformed("refusing rank not below the number of ranks"));
        }
        Ok(Refusal { receiver, seq, sent, receive: String::from_utf8_lossy(text).into_owned() })
    }
}

/// What a rank does when a receiver tells it of a refusal (called from a listener thread).
pub type RefusalHook = Arc<dyn Fn(&Refusal) + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_round_trip_and_bad_ones_are_refused() {
        let r = Refusal {
            receiver: 1,
            seq: 3,
            sent: 4000,
            receive: "a receive of 4800 bytes from rank 0".into(),
        };
        assert_eq!(Refusal::decode(&r.encode(), 2).unwrap(), r);
        assert!(Refusal::decode(&r.encode(), 1).is_err(), "rank 1 of 1");
        assert!(Refusal::decode(&r.encode()[..10], 2).is_err(), "cut short");
        let long = Refusal { receive: "é".repeat(MAX_RECEIVE_TEXT_BYTES), ..r };
        assert!(Refusal::decode(&long.encode(), 2).unwrap().receive.len() <= MAX_RECEIVE_TEXT_BYTES);
    }
}

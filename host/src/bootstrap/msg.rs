//! The payloads of the bootstrap's messages (the frames around them are in [`wire`](super::wire)).
use super::link::PeerInfo;
use super::wire::{Dec, Enc, FrameError, MAX_HOSTNAME, MAX_LOCAL_INFO, MAX_RANKS};
use std::time::Duration;

/// `Kind::RankInfo`: a rank tells the root who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RankHello {
    /// The number of ranks this rank was started with.
    pub nranks: usize,
    /// How much longer this rank waits for the table.
    pub wait: Duration,
    /// The rank's entry for the table.
    pub info: PeerInfo,
}

pub(crate) fn encode_peer(e: &mut Enc, p: &PeerInfo) {
    e.usize(p.rank).u32(p.pid).u64(p.host_hash).bytes(p.hostname.as_bytes()).addr(&p.addr).bytes(&p.info);
}

pub(crate) fn decode_peer(d: &mut Dec<'_>) -> Result<PeerInfo, FrameError> {
    let rank = d.usize()?;
    let pid = d.u32()?;
    let host_hash = d.u64()?;
    let hostname = d.bytes()?;
    if hostname.len() > MAX_HOSTNAME {
        return Err(FrameError::Malformed("host name too long"));
    }
    let addr = d.addr()?;
    let info = d.bytes()?;
    if info.len() > MAX_LOCAL_INFO {
        return Err(FrameError::Malformed("local info too long"));
    }
    let hostname = String::from_utf8_lossy(hostname).into_owned();
    Ok(PeerInfo { rank, addr, host_hash, hostname, pid, info: info.to_vec() })
}

impl RankHello {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.usize(self.nranks).u64(self.wait.as_millis().min(u64::MAX as u128) as u64);
        encode_peer(&mut e, &self.info);
        e.0
    }
    pub fn decode(b: &[u8]) -> Result<RankHello, FrameError> {
        let mut d = Dec::new(b);
        let nranks = d.usize()?;
        let wait = Duration::from_millis(d.u64()?);
        let info = decode_peer(&mut d)?;
        d.finish()?;
        if nranks == 0 || nranks > MAX_RANKS {
            return Err(FrameError::Malformed("number of ranks out of range"));
        }
        if info.rank >= nranks {
            return Err(FrameError::Malformed("rank not below the number of ranks"));
        }
        Ok(RankHello { nranks, wait, info })
    }
}

/// `Kind::PeerInfo`: one table entry.
pub(crate) fn encode_entry(p: &PeerInfo) -> Vec<u8> {
    let mut e = Enc::default();
    encode_peer(&mut e, p);
    e.0
}

pub(crate) fn decode_entry(b: &[u8]) -> Result<PeerInfo, FrameError> {
    let mut d = Dec::new(b);
    let p = decode_peer(&mut d)?;
    d.finish()?;
    Ok(p)
}

/// `Kind::RootError`: why the root gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootErr {
    /// These ranks never connected within `timeout`.
    Missing { nranks: usize, missing: Vec<usize>, timeout: Duration },
    /// Rank `claimed` was claimed by both.
    Duplicate { claimed: usize, claimants: [String; 2] },
    /// (rank, nranks) pairs that disagree.
    Mismatch { first: (usize, usize), second: (usize, usize) },
    /// Anything else.
    Other(String),
}

/// Longest text carried in a root error.
const MAX_ERR_TEXT: usize = 1024;

impl RootErr {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        match self {
            RootErr::Missing { nranks, missing, timeout } => {
                e.u8(1).usize(*nranks).u64(timeout.as_millis().min(u64::MAX as u128) as u64);
                e.usize(missing.len());
                for &r in missing {
                    e.usize(r);
                }
            }
            RootErr::Duplicate { claimed, claimants } => {
                e.u8(2).usize(*claimed);
                for c in claimants {
                    e.bytes(&c.as_bytes()[..c.len().min(MAX_ERR_TEXT)]);
                }
            }
            RootErr::Mismatch { first, second } => {
                e.u8(3).usize(first.0).usize(first.1).usize(second.0).usize(second.1);
            }
            RootErr::Other(s) => {
                e.u8(4).bytes(&s.as_bytes()[..s.len().min(MAX_ERR_TEXT)]);
            }
        }
        e.0
    }

    pub fn decode(b: &[u8]) -> Result<RootErr, FrameError> {
        let mut d = Dec::new(b);
        let text = |d: &mut Dec<'_>| -> Result<String, FrameError> {
            Ok(String::from_utf8_lossy(d.bytes()?).into_owned())
        };
        let r = match d.u8()? {
            1 => {
                let nranks = d.usize()?;
                let timeout = Duration::from_millis(d.u64()?);
                let n = d.usize()?;
                if n > nranks.min(MAX_RANKS) {
                    return Err(FrameError::Malformed("more missing ranks than ranks"));
                }
                let missing = (0..n).map(|_| d.usize()).collect::<Result<_, _>>()?;
                RootErr::Missing { nranks, missing, timeout }
            }
            2 => RootErr::Duplicate { claimed: d.usize()?, claimants: [text(&mut d)?, text(&mut d)?] },
            3 => RootErr::Mismatch { first: (d.usize()?, d.usize()?), second: (d.usize()?, d.usize()?) },
            4 => RootErr::Other(text(&mut d)?),
            _ => return Err(FrameError::Malformed("unknown root error")),
        };
        d.finish()?;
        Ok(r)
    }
}

/// `Kind::Hello`: the first frame on a connection between ranks. `Kind::StatusQuery` carries the
/// same fields (who asks whom, in a communicator of how many), checked the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerHello {
    pub from: usize,
    pub to: usize,
    pub nranks: usize,
}

impl PeerHello {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.usize(self.from).usize(self.to).usize(self.nranks);
        e.0
    }
    pub fn decode(b: &[u8]) -> Result<PeerHello, FrameError> {
        let mut d = Dec::new(b);
        let h = PeerHello { from: d.usize()?, to: d.usize()?, nranks: d.usize()? };
        d.finish()?;
        Ok(h)
    }
}

/// Which kind of traffic a data message belongs to: each has its own tags, so internal
/// collectives never take a message meant for a user's `recv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Lane {
    /// `send` / `recv`.
    User = 0,
    /// Ring collectives: all-gather, barrier, broadcast.
    Ring = 1,
    /// Intra-node broadcast.
    Intra = 2,
    /// A rank whose init failed says why, before it closes its connections (the ranks that
    /// wait on it then name the cause, not the closed connection).
    GaveUp = 3,
    /// A rank left the communicator (see [`depart`](super::depart)): handed to the
    /// communicator's hook by the reader thread, never to the mailbox.
    Left = 4,
    /// A receiver refused this rank's send (see [`refusal`](super::refusal)): handed to the
    /// communicator's hook by the reader thread, never to the mailbox.
    Refused = 5,
}

/// `Kind::Data`: the payload's head (lane, tag); the user bytes follow.
pub(crate) fn encode_data(lane: Lane, tag: u64, data: &[u8]) -> Vec<u8> {
    let mut e = Enc(Vec::with_capacity(9 + data.len()));
    e.u8(lane as u8).u64(tag).tail(data);
    e.0
}

pub(crate) fn decode_data(b: &[u8]) -> Result<(Lane, u64, &[u8]), FrameError> {
    let mut d = Dec::new(b);
    let lane = match d.u8()? {
        0 => Lane::User,
        1 => Lane::Ring,
        2 => Lane::Intra,
        3 => Lane::GaveUp,
        4 => Lane::Left,
        5 => Lane::Refused,
        _ => return Err(FrameError::Malformed("unknown lane")),
    };
    let tag = d.u64()?;
    Ok((lane, tag, d.tail()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> PeerInfo {
        PeerInfo {
            rank: 3,
            addr: "127.0.0.1:5000".parse().unwrap(),
            host_hash: 42,
            hostname: "node".into(),
            pid: 7,
            info: vec![1, 2, 3],
        }
    }

    #[test]
    fn messages_round_trip() {
        let h = RankHello { nranks: 4, wait: Duration::from_millis(1500), info: peer() };
        assert_eq!(RankHello::decode(&h.encode()), Ok(h.clone()));
        assert_eq!(decode_entry(&encode_entry(&peer())), Ok(peer()));
        let bad = RankHello { nranks: 3, ..h };
        assert!(RankHello::decode(&bad.encode()).is_err());
        for e in [
            RootErr::Missing { nranks: 8, missing: vec![3, 5], timeout: Duration::from_secs(2) },
            RootErr::Duplicate { claimed: 1, claimants: ["a".into(), "b".into()] },
            RootErr::Mismatch { first: (0, 3), second: (1, 4) },
            RootErr::Other("no".into()),
        ] {
            assert_eq!(RootErr::decode(&e.encode()), Ok(e));
        }
        let p = PeerHello { from: 1, to: 2, nranks: 3 };
        assert_eq!(PeerHello::decode(&p.encode()), Ok(p));
        assert_eq!(decode_data(&encode_data(Lane::Intra, 9, b"xyz")), Ok((Lane::Intra, 9, &b"xyz"[..])));
        assert!(decode_data(&[7, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        // A huge missing-count is refused before anything is collected.
        let mut e = Enc::default();
        e.u8(1).usize(4).u64(0).usize(u32::MAX as usize);
        assert!(RootErr::decode(&e.0).is_err());
    }
}

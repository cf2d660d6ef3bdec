//! Departures across processes: a rank that leaves its communicator (drops or aborts its
//! `Comm`) while others of it live on tells its ring successor which call it finished last; a
//! rank that hears it, or fails a call because of it, tells its own successor in turn (see
//! `comm::departure`). The message rides the bootstrap connections ([`Lane::Left`]) and is
//! handed by the listener's reader thread straight to the hook the communicator installed, so
//! that it arrives while the rank's owner is blocked in a collective.
use super::link::connect_once;
use super::msg::{encode_data, Lane, PeerHello};
use super::secret::Secret;
use super::wire::{write_frame, Dec, Enc, FrameError, Kind};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// Most bytes of a departure's reason.
pub const MAX_WHY_BYTES: usize = 2048;

/// Rank `rank` left, having finished its calls up to number `done`; `why`: the failure that
/// ended its next call, if one did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Departure {
    /// The rank that left.
    pub rank: usize,
    /// The last call it finished.
    pub done: u64,
    /// Why its next call failed, if it did.
    pub why: Option<String>,
}

impl Departure {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.usize(self.rank).u64(self.done);
        match &self.why {
            Some(w) => e.u8(1).bytes(cut(w, MAX_WHY_BYTES).as_bytes()),
            None => e.u8(0),
        };
        e.0
    }

    pub(crate) fn decode(b: &[u8], nranks: usize) -> Result<Departure, FrameError> {
        let mut d = Dec::new(b);
        let (rank, done) = (d.usize()?, d.u64()?);
        let why = match d.u8()? {
            0 => None,
            1 => {
                let w = d.bytes()?;
                if w.len() > MAX_WHY_BYTES {
                    return Err(FrameError::Malformed("departure reason too long"));
                }
                Some(String::from_utf8_lossy(w).into_owned())
            }
            _ => return Err(FrameError::Malformed("departure reason flag")),
        };
        d.finish()?;
        if rank >= nranks {
            return Err(FrameError::Malformed("departed rank not below the number of ranks"));
        }
        Ok(Departure { rank, done, why })
    }
}

/// `s` cut to at most `max` bytes on a character boundary.
pub(crate) fn cut(s: &str, max: usize) -> &str {
    let mut n = s.len().min(max);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

/// What a rank does when it hears of a departure (called from a listener thread).
pub type DepartureHook = Arc<dyn Fn(&Departure) + Send + Sync>;

/// Tells other ranks of a departure on connections of its own, from any thread (the
/// bootstrap's own connections belong to its owner, who may be blocked).
#[derive(Clone)]
pub struct Notifier {
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    pub(crate) secret: Secret,
    pub(crate) addrs: Arc<Vec<SocketAddr>>,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Notifier(rank {} of {})", self.rank, self.nranks)
    }
}

impl Notifier {
    /// This rank's ring successor.
    pub fn next(&self) -> usize {
        (self.rank + 1) % self.nranks
    }

    /// Tells rank `to` of `d` on a fresh connection (tried once: a rank that is not listening
    /// any more has left), giving up at `deadline`.
    pub fn tell(&self, to: usize, d: &Departure, deadline: Instant) -> Result<(), String> {
        self.send(Lane::Left, to, &d.encode(), deadline)
    }

    /// Sends `data` on `lane` to rank `to` on a fresh connection, tried once.
    pub(crate) fn send(&self, lane: Lane, to: usize, data: &[u8], deadline: Instant) -> Result<(), String> {
        let addr = *self.addrs.get(to).ok_or_else(|| format!("no rank {to}"))?;
        let mut s = connect_once(addr, deadline)?;
        let hello = PeerHello { from: self.rank, to, nranks: self.nranks }.encode();
        write_frame(&mut s, &self.secret, Kind::Hello, &hello, deadline).map_err(|e| e.to_string())?;
        let payload = encode_data(lane, 0, data);
        write_frame(&mut s, &self.secret, Kind::Data, &payload, deadline).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn departures_round_trip_and_bad_ones_are_refused() {
        let d = Departure { rank: 3, done: 41, why: Some("rank 3: timed out".into()) };
        assert_eq!(Departure::decode(&d.encode(), 4).unwrap(), d);
        let d = Departure { rank: 0, done: 0, why: None };
        assert_eq!(Departure::decode(&d.encode(), 1).unwrap(), d);
        assert!(Departure::decode(&d.encode(), 0).is_err());
        assert!(Departure::decode(&[1, 2, 3], 4).is_err());
        let long = "é".repeat(MAX_WHY_BYTES);
        let d = Departure { rank: 1, done: 2, why: Some(long) };
        let back = Departure::decode(&d.encode(), 2).unwrap();
        assert!(back.why.unwrap().len() <= MAX_WHY_BYTES);
    }
}

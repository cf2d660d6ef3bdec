//! [`BootstrapError`]: what went wrong in a bootstrap, naming the rank, the peer and the address.
use std::net::SocketAddr;
use std::time::Duration;

/// Why a bootstrap call failed. Every variant that comes from a rank's call names that rank;
/// those about a connection name the peer (or the root) and its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootstrapError {
    /// A [`UniqueId`](super::UniqueId)'s bytes or text are not acceptable.
    BadId(String),
    /// A call argument is out of range (rank, peer, payload size, timeout).
    InvalidArgument(String),
    /// Some ranks never reached the root in time; the root told every rank that did.
    MissingRanks {
        /// The rank reporting.
        rank: usize,
        /// The number of ranks.
        nranks: usize,
        /// The ranks that never connected, ascending.
        missing: Vec<usize>,
        /// The root's address.
        root: SocketAddr,
        /// How long the ranks waited.
        timeout: Duration,
    },
    /// Two processes claimed the same rank.
    DuplicateRank {
        /// The rank reporting.
        rank: usize,
        /// The rank claimed twice.
        claimed: usize,
        /// Who claimed it first and second ("pid P on HOST").
        claimants: [String; 2],
        /// The root's address.
        root: SocketAddr,
    },
    /// Two ranks disagree on the number of ranks.
    NranksMismatch {
        /// The rank reporting.
        rank: usize,
        /// A rank and the number of ranks it said.
        first: (usize, usize),
        /// Another rank and the different number it said.
        second: (usize, usize),
        /// The root's address.
        root: SocketAddr,
    },
    /// Talking to the root or to a peer failed, or it did not answer in time.
    Link {
        /// The rank reporting.
        rank: usize,
        /// The peer rank, or `None` for the root.
        peer: Option<usize>,
        /// The peer's (or root's) address.
        addr: SocketAddr,
        /// What was being done and what went wrong.
        what: String,
    },
    /// The bootstrap's [`Cancel`](super::Cancel) was cancelled (an abort) while the rank waited.
    Aborted {
        /// The rank reporting.
        rank: usize,
        /// What it was waiting for.
        during: String,
    },
    /// This process could not set itself up (listener, random secret, thread).
    Local {
        /// The rank, where there is one.
        rank: Option<usize>,
        /// What failed.
        what: String,
    },
}

/// `d` as a person writes it: "5 s", "2.5 s", "300 ms".
pub(crate) fn fmt_duration(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        let s = d.as_secs_f64();
        if (s - s.round()).abs() < 0.005 {
            format!("{} s", s.round())
        } else {
            format!("{s:.2} s")
        }
    } else {
        format!("{} ms", d.as_millis())
    }
}

fn list(ranks: &[usize]) -> String {
    const SHOWN: usize = 16;
    let mut s: Vec<String> = ranks.iter().take(SHOWN).map(|r| r.to_string()).collect();
    if ranks.len() > SHOWN {
        s.push(format!("and {} more", ranks.len() - SHOWN));
    }
    s.join(", ")
}

impl std::fmt::Display for BootstrapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BootstrapError::BadId(why) => write!(f, "bad unique id: {why}"),
            BootstrapError::InvalidArgument(why) => write!(f, "invalid argument: {why}"),
            BootstrapError::MissingRanks { rank, nranks, missing, root, timeout } => write!(
                f,
                "rank {rank}: {} {} of {nranks} never connected to the root at {root} within {}",
                if missing.len() == 1 { "rank" } else { "ranks" },
                list(missing),
                fmt_duration(*timeout)
            ),
            BootstrapError::DuplicateRank { rank, claimed, claimants, root } => write!(
                f,
                "rank {rank}: rank {claimed} was claimed twice, by {} and by {} (root at {root})",
                claimants[0], claimants[1]
            ),
            BootstrapError::NranksMismatch { rank, first, second, root } => write!(
                f,
                "rank {rank}: ranks disagree on the number of ranks: rank {} said {}, rank {} said {} \
                 (root at {root})",
                first.0, first.1, second.0, second.1
            ),
            BootstrapError::Link { rank, peer: Some(p), addr, what } => {
                write!(f, "rank {rank}: {what} (rank {p} at {addr})")
            }
            BootstrapError::Link { rank, peer: None, addr, what } => {
                write!(f, "rank {rank}: {what} (root at {addr})")
            }
            BootstrapError::Aborted { rank, during } => write!(f, "rank {rank}: aborted while {during}"),
            BootstrapError::Local { rank: Some(r), what } => write!(f, "rank {r}: {what}"),
            BootstrapError::Local { rank: None, what } => write!(f, "{what}"),
        }
    }
}

impl std::error::Error for BootstrapError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_ranks_and_addresses() {
        let root: SocketAddr = "127.0.0.1:4242".parse().unwrap();
        let e = BootstrapError::MissingRanks {
            rank: 0,
            nranks: 8,
            missing: vec![3, 5],
            root,
            timeout: Duration::from_secs(5),
        };
        let e = crate::Error::from(e);
        assert_eq!(
            e.to_string(),
            "bootstrap: rank 0: ranks 3, 5 of 8 never connected to the root at 127.0.0.1:4242 within 5 s"
        );
        assert_eq!(fmt_duration(Duration::from_millis(2500)), "2.50 s");
        assert_eq!(fmt_duration(Duration::from_millis(300)), "300 ms");
        let l = BootstrapError::Link { rank: 1, peer: Some(2), addr: root, what: "x".into() };
        assert_eq!(l.to_string(), "rank 1: x (rank 2 at 127.0.0.1:4242)");
        let many: Vec<usize> = (0..20).collect();
        assert!(list(&many).ends_with("and 4 more"));
    }
}

//! [`Until`]: how long a network connection's setup may wait — to a deadline, or until the
//! communicator making it is aborted (NCCL's abort flag, which its connect and accept loops
//! check between tries).
use crate::bootstrap::{Cancel, CANCEL_POLL};
use crate::error::{Error, Result};
use std::time::{Duration, Instant};

/// The end of a setup wait ([`Net::connect`](super::Net::connect),
/// [`NetListener::accept`](super::NetListener::accept)): its deadline, or the cancel of the
/// init or communicator it serves, whichever comes first.
///
/// ```
/// use rsccl::bootstrap::Cancel;
/// use rsccl::transport::net::Until;
/// use std::time::{Duration, Instant};
///
/// let cancel = Cancel::new();
/// let until = Until::new(Instant::now() + Duration::from_secs(60), Some(cancel.clone()));
/// assert!(until.check("accepting").is_ok());
/// cancel.cancel();
/// let e = until.check("accepting").unwrap_err().to_string();
/// assert!(e.contains("accepting: aborted"), "{e}");
/// ```
#[derive(Clone, Debug)]
pub struct Until {
    deadline: Instant,
    cancel: Option<Cancel>,
}

impl From<Instant> for Until {
    /// A wait that only its deadline ends.
    fn from(deadline: Instant) -> Until {
        Until { deadline, cancel: None }
    }
}

impl Until {
    /// A wait that ends at `deadline`, or once `cancel` is cancelled.
    pub fn new(deadline: Instant, cancel: Option<Cancel>) -> Until {
        Until { deadline, cancel }
    }

    /// The deadline.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the wait was cancelled.
    pub fn cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(Cancel::is_cancelled)
    }

    /// Whether the wait is over: cancelled, or past its deadline.
    pub fn over(&self) -> bool {
        self.cancelled() || Instant::now() >= self.deadline
    }

    /// `Err` naming `what` once the wait was cancelled ("aborted") or its deadline passed
    /// ("timed out").
    pub fn check(&self, what: &str) -> Result<()> {
        if self.cancelled() {
            return Err(Error::Network(format!("{what}: aborted")));
        }
        if Instant::now() >= self.deadline {
            return Err(Error::Network(format!("{what}: timed out")));
        }
        Ok(())
    }

    /// How long a blocking step of the wait may last before it looks again: the time left, at
    /// most [`CANCEL_POLL`] where a cancel may come; `Err` as [`Until::check`].
    pub fn slice(&self, what: &str) -> Result<Duration> {
        Ok(self.left(what)?.min(if self.cancel.is_some() { CANCEL_POLL } else { Duration::MAX }))
    }

    /// How long one connection attempt may take: the time left, at most the bootstrap's
    /// 2-second attempt where a cancel may come (a new attempt restarts the handshake, so it
    /// is not sliced as finely as a read); `Err` as [`Until::check`].
    pub fn attempt(&self, what: &str) -> Result<Duration> {
        let most = if self.cancel.is_some() { crate::bootstrap::CONNECT_SLICE } else { Duration::MAX };
        Ok(self.left(what)?.min(most))
    }

    /// The time left (at least a millisecond), `Err` as [`Until::check`].
    fn left(&self, what: &str) -> Result<Duration> {
        self.check(what)?;
        Ok(self.deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_short_only_where_a_cancel_may_come() {
        let far = Instant::now() + Duration::from_secs(60);
        assert!(Until::from(far).slice("x").unwrap() > Duration::from_secs(50));
        let c = Cancel::new();
        let u = Until::new(far, Some(c.clone()));
        assert_eq!(u.slice("x").unwrap(), CANCEL_POLL);
        assert!(!u.over());
        c.cancel();
        assert!(u.over() && u.cancelled());
        assert!(u.slice("x").unwrap_err().to_string().contains("x: aborted"));
        assert_eq!(
            Until::new(far, Some(Cancel::new())).attempt("x").unwrap(),
            crate::bootstrap::CONNECT_SLICE
        );
        assert!(Until::from(far).attempt("x").unwrap() > Duration::from_secs(50));
        let past = Until::from(Instant::now() - Duration::from_millis(1));
        assert!(past.over() && !past.cancelled());
        assert!(past.check("y").unwrap_err().to_string().contains("y: timed out"));
    }
}

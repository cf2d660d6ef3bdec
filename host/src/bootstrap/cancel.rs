//! [`Cancel`]: stops a bootstrap's waits from another thread, as NCCL's abort flag stops its
//! bootstrap's socket loops (`ncclCommAbort` of a nonblocking init still running).
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often a wait that can be cancelled looks at its [`Cancel`]: how long an abort waits
/// for a bootstrap wait to end, except for a connection attempt in progress to an address
/// that does not answer (at most its 2-second attempt).
pub const CANCEL_POLL: Duration = Duration::from_millis(100);

/// A flag shared by a [`Bootstrap`](super::Bootstrap) (and the init that makes it) and whoever
/// may stop it: once [`cancel`](Cancel::cancel)led, every wait of the bootstrap — for the root,
/// for a peer's connection, for a message — ends within about [`CANCEL_POLL`] with
/// [`BootstrapError::Aborted`](super::BootstrapError::Aborted), and so does every later one,
/// and no new connection is tried. A send over a connection made already is not stopped (it is
/// bounded by its deadline).
///
/// ```
/// use rsccl::bootstrap::{Bootstrap, Cancel};
/// use rsccl::UniqueId;
/// use std::time::{Duration, Instant};
///
/// // Rank 1 of 2 never comes: without the cancel this init would wait its whole minute.
/// let id = UniqueId::with_addr("127.0.0.1:0".parse().unwrap())?;
/// let cancel = Cancel::default();
/// let c = cancel.clone();
/// let t = std::thread::spawn(move || {
///     Bootstrap::init_cancellable(&id, 0, 2, b"", Duration::from_secs(60), None, &c)
/// });
/// std::thread::sleep(Duration::from_millis(100));
/// let asked = Instant::now();
/// cancel.cancel();
/// let e = t.join().unwrap().unwrap_err();
/// assert!(asked.elapsed() < Duration::from_secs(5));
/// assert!(e.to_string().contains("aborted"), "{e}");
/// # Ok::<(), rsccl::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    flag: AtomicBool,
    /// A flag this one also answers to, until [`Cancel::unlink`] (a split's parent: aborting
    /// it stops the child's init, as NCCL's `childAbortFlag`).
    parent: Mutex<Option<Cancel>>,
}

impl Cancel {
    /// A flag not yet cancelled.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// A new flag that is also cancelled while `parent` is, until [`unlink`](Cancel::unlink)
    /// (cancelling it leaves `parent` alone).
    pub fn linked_to(parent: &Cancel) -> Cancel {
        Cancel(Arc::new(Inner { flag: AtomicBool::new(false), parent: Mutex::new(Some(parent.clone())) }))
    }

    /// Stops answering to the parent given to [`linked_to`](Cancel::linked_to) (once the child
    /// it guarded stands on its own).
    pub fn unlink(&self) {
        *self.0.parent.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Stops the waits of every bootstrap sharing this flag, now and from now on.
    pub fn cancel(&self) {
        self.0.flag.store(true, Ordering::Release);
    }

    /// Whether [`cancel`](Cancel::cancel) was called, on this flag or on the one it is linked to.
    pub fn is_cancelled(&self) -> bool {
        self.0.flag.load(Ordering::Acquire)
            || self
                .0
                .parent
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .is_some_and(Cancel::is_cancelled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linked_flag_follows_its_parent_until_unlinked_and_never_leads_it() {
        let parent = Cancel::new();
        let child = Cancel::linked_to(&parent);
        child.cancel();
        assert!(!parent.is_cancelled(), "a child's cancel stays its own");
        let child = Cancel::linked_to(&parent);
        parent.cancel();
        assert!(child.is_cancelled());
        let (parent, child) = (Cancel::new(), Cancel::linked_to(&Cancel::new()));
        let linked = Cancel::linked_to(&parent);
        linked.unlink();
        parent.cancel();
        assert!(!linked.is_cancelled(), "unlinked");
        assert!(!child.is_cancelled());
    }
}

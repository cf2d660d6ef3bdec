//! Memory that ranks of one process reach by address (NVLS buffers, symmetric windows): each
//! rank offers its buffers here, by address, and takes a share of every peer's, so none is
//! freed while a rank that can reach it lives (a rank that drops its `Comm` or window early no
//! longer frees what the others' kernels write).
use crate::backend::DeviceBuffer;
use crate::error::{Error, Result};
use rsccl_device::DevPtr;
use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// What keeps a peer's buffer alive.
pub(super) type Share = Arc<dyn Any + Send + Sync>;

static OFFERED: Mutex<Option<HashMap<u64, Weak<dyn Any + Send + Sync>>>> = Mutex::new(None);

/// Offers `bufs` (before their addresses go to the peers).
pub(super) fn offer(bufs: &[DeviceBuffer]) {
    let mut t = OFFERED.lock().unwrap_or_else(|p| p.into_inner());
    let t = t.get_or_insert_with(HashMap::new);
    t.retain(|_, w| w.strong_count() > 0);
    for b in bufs.iter().filter(|b| b.ptr() != DevPtr::NULL) {
        t.insert(b.ptr().0, Arc::downgrade(&b.keep_alive()));
    }
}

/// A share of every peer's buffer of `uc` (`uc[k][r]`: rank `r`'s buffer `k`), all but
/// `me`'s; an error names a peer whose buffer is not offered here (gone already).
pub(super) fn take(uc: &[Vec<DevPtr>], me: usize) -> Result<Vec<Share>> {
    let mut t = OFFERED.lock().unwrap_or_else(|p| p.into_inner());
    let t = t.get_or_insert_with(HashMap::new);
    let mut out = Vec::new();
    for (k, ptrs) in uc.iter().enumerate() {
        for (r, p) in ptrs.iter().enumerate().filter(|&(r, p)| r != me && *p != DevPtr::NULL) {
            let share = t.get(&p.0).and_then(Weak::upgrade).ok_or_else(|| {
                Error::InvalidConfig(format!(
                    "rank {r}'s buffer {k} at {:#x} is not in this process any more",
                    p.0
                ))
            })?;
            out.push(share);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer's share keeps a buffer bound by address alive after its owner dropped it, and a
    /// buffer gone before the shares were taken is named.
    #[test]
    fn shares_outlive_the_owner() {
        let be = crate::backend::cpu();
        let mine = vec![be.alloc(64).unwrap()];
        let theirs = vec![be.alloc(64).unwrap()];
        offer(&mine);
        offer(&theirs);
        let uc = vec![vec![mine[0].ptr(), theirs[0].ptr()]];
        let shares = take(&uc, 0).unwrap();
        assert_eq!(shares.len(), 1);
        let weak = std::sync::Arc::downgrade(&shares[0]);
        drop(theirs);
        assert!(weak.upgrade().is_some(), "the owner's drop freed memory a peer still reaches");
        drop(shares);
        assert!(weak.upgrade().is_none());
        let e = take(&uc, 0).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("rank 1's buffer 0") && e.contains("not in this process any more"), "{e}");
    }
}

//! Ranks of one process that leave their communicator (drop or abort their [`Comm`](super::Comm))
//! while others of it live on: the others learn it at once — a call that starts is refused, and
//! a kernel in flight is stopped through its abort word — instead of waiting for the timeout on
//! a rank that will never come (or touching its memory).
//!
//! One table per process, by communicator key (the same on every rank of one communicator).
use crate::backend::HostMapped;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

struct Member {
    rank: usize,
    /// The word its kernels poll (set to stop them).
    abort: Weak<HostMapped>,
    left: bool,
}

static MEMBERS: Mutex<Option<HashMap<u128, Vec<Member>>>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut HashMap<u128, Vec<Member>>) -> T) -> T {
    let mut t = MEMBERS.lock().unwrap_or_else(|p| p.into_inner());
    f(t.get_or_insert_with(HashMap::new))
}

/// Rank `rank` of communicator `key` lives in this process, its kernels stopped by `abort`.
pub(crate) fn join(key: u128, rank: usize, abort: &Arc<HostMapped>) {
    with(|t| t.entry(key).or_default().push(Member { rank, abort: Arc::downgrade(abort), left: false }));
}

/// Rank `rank` of `key` leaves: it is marked first, then every other member's kernels are told
/// to stop (a member that arms its abort word after this sees the mark: see [`left`]).
pub(crate) fn leave(key: u128, rank: usize) {
    let others: Vec<Arc<HostMapped>> = with(|t| {
        let Some(members) = t.get_mut(&key) else { return Vec::new() };
        members.iter_mut().filter(|m| m.rank == rank).for_each(|m| m.left = true);
        let others = members.iter().filter(|m| !m.left).filter_map(|m| m.abort.upgrade()).collect();
        // The last to leave removes the communicator.
        if members.iter().all(|m| m.left) {
            t.remove(&key);
        }
        others
    });
    for a in others {
        let _ = a.store_u32(0, 1);
    }
}

/// The ranks of `key` that left, but `me` (in rank order). Checked after arming the abort
/// word: a rank that leaves later stores into the armed word.
pub(crate) fn left(key: u128, me: usize) -> Vec<usize> {
    with(|t| {
        let mut v: Vec<usize> = t
            .get(&key)
            .map(|ms| ms.iter().filter(|m| m.left && m.rank != me).map(|m| m.rank).collect())
            .unwrap_or_default();
        v.sort_unstable();
        v.dedup();
        v
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaving_stops_the_others_and_the_last_removes_the_communicator() {
        let be = crate::backend::cpu();
        let key = 0xdead_beef_u128 << 64 | 42;
        let words: Vec<Arc<HostMapped>> = (0..3).map(|_| Arc::new(be.alloc_mapped(4).unwrap())).collect();
        for (r, w) in words.iter().enumerate() {
            join(key, r, w);
        }
        leave(key, 2);
        assert_eq!(left(key, 0), [2]);
        assert_eq!(left(key, 2), Vec::<usize>::new());
        let stopped: Vec<u32> = words.iter().map(|w| w.load_u32(0).unwrap()).collect();
        assert_eq!(stopped, [1, 1, 0]);
        leave(key, 0);
        leave(key, 1);
        assert!(with(|t| !t.contains_key(&key)));
    }
}

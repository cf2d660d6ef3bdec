//! Ranks of one process that leave their communicator (drop or abort their [`Comm`](super::Comm))
//! while others of it live on: the others learn it at once — a call the leaver never finished
//! is refused when it starts, and stopped through its abort word when it is in flight —
//! instead of waiting for the timeout on a rank that will never come (or touching its memory).
//! Calls the leaver finished before it left are left to end.
//!
//! One table per process, by communicator key (the same on every rank of one communicator).
use super::hang::Progress;
use crate::backend::HostMapped;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

struct Member {
    rank: usize,
    /// The word its kernels poll (set to stop them).
    abort: Weak<HostMapped>,
    /// Where it is in its calls.
    progress: Weak<Progress>,
    /// Once it left: the last call it finished, and why its next one failed, if it did.
    left: Option<(u64, Option<String>)>,
}

static MEMBERS: Mutex<Option<HashMap<u128, Vec<Member>>>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut HashMap<u128, Vec<Member>>) -> T) -> T {
    let mut t = MEMBERS.lock().unwrap_or_else(|p| p.into_inner());
    f(t.get_or_insert_with(HashMap::new))
}

/// Rank `rank` of communicator `key` lives in this process, its kernels stopped by `abort`,
/// its calls counted by `progress`.
pub(crate) fn join(key: u128, rank: usize, abort: &Arc<HostMapped>, progress: &Arc<Progress>) {
    with(|t| {
        t.entry(key).or_default().push(Member {
            rank,
            abort: Arc::downgrade(abort),
            progress: Arc::downgrade(progress),
            left: None,
        })
    });
}

/// Rank `rank` of `key` leaves, having finished calls up to `done` (`why`: the failure that
/// ended its next call, if one did): it is marked first, then every other member whose call
/// in flight is a later one is told to stop (a member that arms its abort word after this
/// sees the mark: see [`left`]).
pub(crate) fn leave(key: u128, rank: usize, done: u64, why: Option<String>) {
    let others: Vec<Arc<HostMapped>> = with(|t| {
        let Some(members) = t.get_mut(&key) else { return Vec::new() };
        members.iter_mut().filter(|m| m.rank == rank).for_each(|m| m.left = Some((done, why.clone())));
        let waiting =
            |m: &Member| m.progress.upgrade().and_then(|p| p.in_flight()).is_some_and(|(seq, _)| seq > done);
        let others = members
            .iter()
            .filter(|m| m.left.is_none() && waiting(m))
            .filter_map(|m| m.abort.upgrade())
            .collect();
        // The last to leave removes the communicator.
        if members.iter().all(|m| m.left.is_some()) {
            t.remove(&key);
        }
        others
    });
    for a in others {
        let _ = a.store_u32(0, 1);
    }
}

/// The ranks of `key` but `me` that left before finishing call `seq`, each with the failure
/// that ended its call if one did (in rank order). Checked after arming the abort word: a
/// rank that leaves later stores into the armed word.
pub(crate) fn left(key: u128, me: usize, seq: u64) -> Vec<(usize, Option<String>)> {
    with(|t| {
        let mut v: Vec<(usize, Option<String>)> = t
            .get(&key)
            .map(|ms| {
                ms.iter()
                    .filter(|m| m.rank != me)
                    .filter_map(|m| {
                        m.left.as_ref().filter(|(d, _)| *d < seq).map(|(_, why)| (m.rank, why.clone()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort_unstable();
        v.dedup_by_key(|(r, _)| *r);
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
        let progress: Vec<Arc<Progress>> = (0..3).map(|_| Arc::new(Progress::default())).collect();
        for (r, (w, p)) in words.iter().zip(&progress).enumerate() {
            join(key, r, w, p);
        }
        // Ranks 0 and 1 are in call #2; rank 1's #1 is still finishing.
        let ar = rsccl_device::coll::Collective::AllReduce;
        for p in &progress[..2] {
            p.enter(ar, false);
        }
        progress[0].finish(1);
        progress[0].enter(ar, false);
        // Rank 2 finished #1 and leaves: rank 0's #2 stops, rank 1's #1 goes on.
        leave(key, 2, 1, Some("its call #2 timed out".into()));
        assert_eq!(
            (left(key, 0, 2), left(key, 0, 1)),
            (vec![(2, Some("its call #2 timed out".into()))], vec![])
        );
        assert_eq!(left(key, 2, 2), vec![]);
        let stopped: Vec<u32> = words.iter().map(|w| w.load_u32(0).unwrap()).collect();
        assert_eq!(stopped, [1, 0, 0]);
        leave(key, 0, 1, None);
        leave(key, 1, 1, None);
        assert!(with(|t| !t.contains_key(&key)));
    }
}

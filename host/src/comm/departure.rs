//! Ranks of one process that leave their communicator (drop or abort their [`Comm`](super::Comm))
//! while others of it live on: the others learn it at once — a call the leaver never finished
//! is refused when it starts, and stopped through its abort word when it is in flight —
//! instead of waiting for the timeout on a rank that will never come (or touching its memory).
//! Calls the leaver finished before it left are left to end.
//!
//! One table per process, by communicator key (the same on every rank of one communicator).
//! Ranks of other processes learn it over the bootstrap ([`crate::bootstrap::depart`]): the
//! leaver tells its ring successor, which records it here ([`heard`]) and, while it waits in a
//! call the leaver never finished — or when it fails one because of it — tells its own
//! successor ([`Relay`]). A normal teardown, where nobody waits, costs one message per rank.
use super::hang::{Progress, RankState};
use crate::backend::HostMapped;
use crate::bootstrap::{Departure, Notifier};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

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
    mark(key, rank, done, why, false);
}

/// Rank `rank` of `key` leaves because others left before it (its call failed naming them):
/// it is only forgotten. Whoever waits on it waits on a call they never finished either, and
/// hears of them; reporting it too would name a consequence beside the cause.
pub(crate) fn forget(key: u128, rank: usize) {
    with(|t| {
        let Some(members) = t.get_mut(&key) else { return };
        // Its own entry goes (a record heard from another process has no progress to count).
        members.retain(|m| m.rank != rank || m.progress.strong_count() == 0);
        if members.iter().all(|m| m.left.is_some()) {
            t.remove(&key);
        }
    })
}

/// Rank `rank` of `key`, a rank of another process, left having finished calls up to `done`:
/// recorded (where this process still has members of `key`) and the members waiting on a
/// later call stopped, as for [`leave`]. True when this process had not heard it yet.
pub(crate) fn heard(key: u128, rank: usize, done: u64, why: Option<String>) -> bool {
    mark(key, rank, done, why, true)
}

fn mark(key: u128, rank: usize, done: u64, why: Option<String>, remote: bool) -> bool {
    let (new, others): (bool, Vec<Arc<HostMapped>>) = with(|t| {
        let Some(members) = t.get_mut(&key) else { return (false, Vec::new()) };
        let new = if remote {
            let new = !members.iter().any(|m| m.rank == rank);
            if new {
                let (abort, progress) = (Weak::new(), Weak::new());
                members.push(Member { rank, abort, progress, left: Some((done, why)) });
            }
            new
        } else {
            members.iter_mut().filter(|m| m.rank == rank).for_each(|m| m.left = Some((done, why.clone())));
            true
        };
        // In a later call, or about to enter one (a member between arming its word and
        // entering its call checked for departures before this); behind its groups that do
        // not need the leaver, the stop waits for them to end.
        let waiting = |m: &Member| m.progress.upgrade().is_some_and(|p| p.on_departure(done, &m.abort));
        let others = members
            .iter()
            .filter(|m| m.left.is_none() && waiting(m))
            .filter_map(|m| m.abort.upgrade())
            .collect();
        // The last to leave removes the communicator.
        if members.iter().all(|m| m.left.is_some()) {
            t.remove(&key);
        }
        (new, others)
    });
    for a in others {
        let _ = a.store_u32(0, 1);
    }
    new
}

/// The ranks of `key` but `me` that left before finishing call `seq` (in rank order).
/// Checked after arming the abort word: a rank that leaves later stores into the armed word.
pub(crate) fn left(key: u128, me: usize, seq: u64) -> Vec<Departure> {
    with(|t| {
        let mut v: Vec<Departure> = t
            .get(&key)
            .map(|ms| {
                ms.iter()
                    .filter(|m| m.rank != me)
                    .filter_map(|m| {
                        let (done, why) = m.left.as_ref().filter(|(d, _)| *d < seq)?;
                        Some(Departure { rank: m.rank, done: *done, why: why.clone() })
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by_key(|d| d.rank);
        v.dedup_by_key(|d| d.rank);
        v
    })
}

/// Why a rank leaves, as its departure tells it.
pub(crate) enum Why {
    /// Its calls ended (or it aborted them): nothing failed first.
    Done,
    /// A call of its failed first, with this error.
    Failed(String),
    /// Its call failed because others had left: not news (see [`forget`]).
    TheyLeft,
}

/// One rank's leaving: done once, in this process at the first [`Leaving::go`] and to the
/// ranks of other processes at the first with the bootstrap at hand (an abort may find it
/// held by another thread; the drop then tells).
#[derive(Default)]
pub(crate) struct Leaving {
    left: std::sync::atomic::AtomicBool,
    told: std::sync::atomic::AtomicBool,
    /// Why, as given the first time.
    why: Mutex<Option<String>>,
}

impl Leaving {
    /// Rank `rank` of `key` (its calls counted by `progress`) leaves; `why`: the failure that
    /// ended its last call, if one did.
    pub fn go(
        &self,
        (key, rank, progress): (u128, usize, &Progress),
        why: Why,
        boot: Option<&mut crate::bootstrap::Bootstrap>,
    ) {
        use std::sync::atomic::Ordering;
        let done = progress.done_before_failure();
        let mut w = self.why.lock().unwrap_or_else(|p| p.into_inner());
        let why = match why {
            Why::Done => None,
            Why::Failed(e) => Some(e),
            Why::TheyLeft => {
                if !self.left.swap(true, Ordering::AcqRel) {
                    self.told.store(true, Ordering::Release);
                    forget(key, rank);
                }
                return;
            }
        };
        if !self.left.swap(true, Ordering::AcqRel) {
            *w = why;
            leave(key, rank, done, w.clone());
        }
        if let Some(b) = boot {
            if !self.told.swap(true, Ordering::AcqRel) {
                b.tell_leaving(&Departure { rank, done, why: w.clone() });
            }
        }
    }
}

/// Whether rank `rank` of `key` is known here to have left.
pub(crate) fn has_left(key: u128, rank: usize) -> bool {
    with(|t| t.get(&key).is_some_and(|ms| ms.iter().any(|m| m.rank == rank && m.left.is_some())))
}

/// How long telling a rank of a departure may take.
const TELL_TIMEOUT: Duration = Duration::from_millis(500);

/// One rank's part in passing departures around the ring: each departed rank is passed on to
/// the ring successor once at most (never back to the rank that left).
pub(crate) struct Relay {
    notifier: Notifier,
    told: Mutex<HashSet<usize>>,
}

impl Relay {
    pub fn new(notifier: Notifier) -> Relay {
        Relay { notifier, told: Mutex::new(HashSet::new()) }
    }

    /// Passes `d` on to this rank's ring successor, unless it did already.
    pub fn pass_on(&self, d: &Departure) {
        let next = self.notifier.next();
        if next == d.rank || !self.told.lock().unwrap_or_else(|p| p.into_inner()).insert(d.rank) {
            return;
        }
        if let Err(e) = self.notifier.tell(next, d, Instant::now() + TELL_TIMEOUT) {
            tracing::debug!("telling rank {next} that rank {} left: {e}", d.rank);
        }
    }
}

/// How often a leaving rank asks whether its peers' kernels stopped.
const STOPPED_POLL: Duration = Duration::from_millis(20);

/// Asks every rank's status (`ask`, answered by their listeners; entry `r` is rank `r`'s)
/// until no rank is `busy` — a rank that cannot be reached is gone, and its kernels with its
/// process — or `limit` passed (the peers' own timeout ends their kernels by then). Returns
/// the ranks still busy at the end.
fn wait_peers(
    mut ask: impl FnMut() -> Vec<std::result::Result<Vec<u8>, String>>,
    limit: Duration,
    busy: impl Fn(usize, &RankState) -> bool,
) -> Vec<usize> {
    let deadline = Instant::now() + limit;
    loop {
        let still: Vec<usize> = ask()
            .iter()
            .enumerate()
            .filter(|(r, a)| a.as_ref().is_ok_and(|b| RankState::decode(b).is_some_and(|s| busy(*r, &s))))
            .map(|(r, _)| r)
            .collect();
        if still.is_empty() || Instant::now() >= deadline {
            return still;
        }
        std::thread::sleep(STOPPED_POLL);
    }
}

/// Before a rank unbinds its memory from GPU multicast objects (its `Comm` drops), the peers'
/// kernels must have stopped: they reach that memory through the object, and unbinding it
/// under a running multimem operation is undefined (CUDA's `cuMulticastUnbind`). A departing
/// rank has stopped their calls it never finished; this waits until no rank but `me`
/// reports a call whose kernels may still run (see [`wait_peers`]).
pub(crate) fn wait_peers_stopped(
    me: usize,
    ask: impl FnMut() -> Vec<std::result::Result<Vec<u8>, String>>,
    limit: Duration,
) -> Vec<usize> {
    wait_peers(ask, limit, |r, s| r != me && s.entered > s.done.max(s.ended))
}

/// Before a rank frees memory that ranks of other processes opened (its P2P connections,
/// symmetric memory, the symmetric LL scratch) on a backend where that memory dies with its
/// owner (CUDA IPC: [`Backend::exported_outlives_owner`](crate::backend::Backend)), their
/// kernels must no longer reach it: this waits until none of `importers` has a collective
/// whose kernels may still run that this rank never finished (`done`: the last it did; those
/// it finished wrote all they had for it) nor a point-to-point group whose kernels may (see
/// [`wait_peers`]). Kernels that ended count as stopped whether or not their host completed
/// the call yet. Its departure, told before, stops those calls.
pub(crate) fn wait_importers_stopped(
    importers: &[usize],
    done: u64,
    ask: impl FnMut() -> Vec<std::result::Result<Vec<u8>, String>>,
    limit: Duration,
) -> Vec<usize> {
    wait_peers(ask, limit, |r, s| {
        let (calls, groups) = (s.done.max(s.ended), s.groups_done.max(s.groups_ended));
        importers.contains(&r) && (s.groups > groups || (s.entered > calls && s.entered > done))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four ranks of communicator `key` joined: their abort words and progress.
    fn members(key: u128) -> (Vec<Arc<HostMapped>>, Vec<Arc<Progress>>) {
        let be = crate::backend::cpu();
        let words: Vec<Arc<HostMapped>> = (0..4).map(|_| Arc::new(be.alloc_mapped(4).unwrap())).collect();
        let progress: Vec<Arc<Progress>> = (0..4).map(|_| Arc::new(Progress::default())).collect();
        for (r, (w, p)) in words.iter().zip(&progress).enumerate() {
            join(key, r, w, p);
        }
        (words, progress)
    }

    #[test]
    fn leaving_stops_the_others_and_the_last_removes_the_communicator() {
        let key = 0xdead_beef_u128 << 64 | 42;
        let (words, progress) = members(key);
        // Ranks 0 and 1 are in call #2; rank 1's #1 is still finishing.
        let ar = rsccl_device::coll::Collective::AllReduce;
        for p in &progress[..2] {
            p.enter(ar, false);
        }
        progress[0].finish(1);
        progress[0].enter(ar, false);
        // Rank 3 is between calls #1 and #2 (it may have armed its word for #2 already).
        progress[3].enter(ar, false);
        progress[3].finish(1);
        // Rank 2 finished #1 and leaves: rank 0's #2 stops, and rank 3's coming one; rank 1's
        // #1 goes on.
        leave(key, 2, 1, Some("its call #2 timed out".into()));
        let gone = Departure { rank: 2, done: 1, why: Some("its call #2 timed out".into()) };
        assert_eq!((left(key, 0, 2), left(key, 0, 1)), (vec![gone], vec![]));
        assert_eq!(left(key, 2, 2), vec![]);
        let stopped: Vec<u32> = words.iter().map(|w| w.load_u32(0).unwrap()).collect();
        assert_eq!(stopped, [1, 0, 0, 1]);
        // Rank 7 of another process left after #0: recorded once, rank 1's #1 stops now.
        assert!(heard(key, 7, 0, None) && !heard(key, 7, 0, None));
        assert_eq!(words[1].load_u32(0).unwrap(), 1);
        assert_eq!(left(key, 1, 1), vec![Departure { rank: 7, done: 0, why: None }]);
        leave(key, 0, 1, None);
        leave(key, 1, 1, None);
        leave(key, 3, 1, None);
        assert!(with(|t| !t.contains_key(&key)));
    }

    #[test]
    fn groups_ahead_of_the_call_a_departure_concerns_go_on_and_the_stop_follows_them() {
        let key = 0xfeed_u128 << 64 | 7;
        let (words, progress) = members(key);
        let ar = rsccl_device::coll::Collective::AllReduce;
        // Rank 0: a send in flight (group #1), collective #1 queued behind it.
        let send = progress[0].enter_p2p(0);
        progress[0].enter(ar, false);
        // Rank 1: a group holding collective #1.
        let _holding = progress[1].enter_p2p(1);
        progress[1].enter(ar, false);
        // Rank 3: a receive in flight, no collective.
        let recv = progress[3].enter_p2p(0);
        leave(key, 2, 0, None);
        let stopped = || words.iter().map(|w| w.load_u32(0).unwrap()).collect::<Vec<u32>>();
        assert_eq!(stopped(), [0, 1, 0, 0], "only the group holding the collective stops now");
        // Rank 0's send ends: the collective behind it stops. Rank 3's receive ends with no
        // collective in flight: nothing to stop yet; the collective it enters next (one that
        // checked for departures before rank 2 left) is stopped as it enters.
        progress[0].kernels_ended(send.number());
        progress[3].kernels_ended(recv.number());
        assert_eq!(stopped(), [1, 1, 0, 0]);
        progress[3].enter(ar, false);
        assert_eq!(stopped(), [1, 1, 0, 1]);
        words[3].store_u32(0, 0).unwrap();
        // The group's completion on the host ends it again: nothing more happens.
        words[0].store_u32(0, 0).unwrap();
        drop((send, recv));
        assert_eq!(stopped(), [0, 1, 0, 0]);
        for r in [0, 1, 3] {
            leave(key, r, 0, None);
        }
        assert!(with(|t| !t.contains_key(&key)));
    }

    /// A departing rank waits for its peers' kernels: until every answer shows no call in
    /// flight (an unreachable rank counts as stopped), or the limit, naming who still runs.
    #[test]
    fn unbinding_waits_until_the_peers_stopped() {
        let st =
            |entered: u64, done: u64| Ok(format!("rsccl-progress {entered} {done} 1 0 0 0 0 0").into_bytes());
        let mut asked = 0;
        let busy = wait_peers_stopped(
            0,
            || {
                asked += 1;
                // Rank 0 itself is in flight (ignored); rank 1 finishes at the third ask;
                // rank 2 is gone.
                let r1 = if asked < 3 { st(5, 4) } else { st(5, 5) };
                vec![st(6, 5), r1, Err("unreachable: connection refused".into())]
            },
            Duration::from_secs(10),
        );
        assert_eq!((busy, asked), (vec![], 3));
        let start = Instant::now();
        let busy = wait_peers_stopped(1, || vec![st(2, 1), st(0, 0), st(9, 3)], Duration::from_millis(100));
        assert_eq!(busy, vec![0, 2]);
        // A call whose kernels ended is no longer in flight for it, completed or not.
        let ended = Ok(b"rsccl-progress 9 3 1 0 0 0 9 0".to_vec());
        assert_eq!(
            wait_peers_stopped(1, || vec![st(0, 0), st(0, 0), ended.clone()], Duration::from_secs(5)),
            vec![]
        );
        assert!(start.elapsed() >= Duration::from_millis(100) && start.elapsed() < Duration::from_secs(2));
    }

    /// A rank freeing memory other processes opened waits only for those processes' ranks,
    /// and only for their calls it never finished and their groups.
    #[test]
    fn freeing_exported_memory_waits_for_the_importers_calls_it_never_finished() {
        // entered, done, groups, groups_done (no kernel ended before the host completed it).
        let st = |e: u64, d: u64, g: u64, gd: u64| {
            Ok(format!("rsccl-progress {e} {d} 1 0 {g} {gd} 0 0").into_bytes())
        };
        let mut asked = 0;
        // This rank (1) finished call 4. Rank 0 (another process) runs call 5 until the third
        // ask; rank 2 runs call 4 (finished here) and rank 3 a group until the second; rank 4
        // (this process: no importer) runs call 9 throughout.
        let busy = wait_importers_stopped(
            &[0, 2, 3],
            4,
            || {
                asked += 1;
                let r0 = if asked < 3 { st(5, 4, 0, 0) } else { st(5, 5, 0, 0) };
                let r3 = if asked < 2 { st(4, 4, 2, 1) } else { st(4, 4, 2, 2) };
                vec![r0, st(6, 4, 0, 0), st(4, 3, 0, 0), r3, st(9, 3, 0, 0)]
            },
            Duration::from_secs(10),
        );
        assert_eq!((busy, asked), (vec![], 3));
        let start = Instant::now();
        let busy = wait_importers_stopped(
            &[0, 2],
            4,
            || vec![st(5, 4, 0, 0), st(9, 0, 0, 0), st(4, 4, 3, 2)],
            Duration::from_millis(60),
        );
        assert_eq!(busy, vec![0, 2]);
        assert!(start.elapsed() >= Duration::from_millis(60) && start.elapsed() < Duration::from_secs(2));
        // Kernels that ended count as stopped, the host's completion or not: rank 0's call 5
        // and rank 2's group 3 ended, neither completed.
        let ended = |e: u64, d: u64, g: u64, gd: u64, en: u64, gen: u64| {
            Ok(format!("rsccl-progress {e} {d} 1 0 {g} {gd} {en} {gen}").into_bytes())
        };
        let busy = wait_importers_stopped(
            &[0, 2],
            4,
            || vec![ended(5, 4, 0, 0, 5, 0), ended(9, 0, 0, 0, 0, 0), ended(4, 4, 3, 2, 4, 3)],
            Duration::from_secs(10),
        );
        assert_eq!(busy, Vec::<usize>::new());
    }
}

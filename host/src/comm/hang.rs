//! Hang reports: every collective of a communicator carries a sequence number (every rank
//! calls them in the same order, so the numbers match across ranks). A rank whose collective
//! times out asks every other rank, over the bootstrap network, which collective it last
//! entered and finished, and says who is behind: "rank 5 never entered all_reduce #812 (last
//! completed #811); ranks 0–4, 6–7 wait in it" — the question NCCL users are left with after a
//! watchdog timeout.
use crate::backend::HostMapped;
use rsccl_device::coll::Collective;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Weak};

/// Where one rank is in its communicator's sequence of collectives. Shared with the bootstrap's
/// listener threads, which answer status queries from it while the rank is blocked.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Number of the last collective entered (1-based; 0: none yet).
    entered: AtomicU64,
    /// Number of the last collective finished (successfully or not).
    done: AtomicU64,
    /// What the last entered collective is ([`op_code`]).
    what: AtomicU64,
    /// Number of the last collective that failed (0: none).
    failed: AtomicU64,
    /// Point-to-point groups whose kernels have not ended: only some ranks take part in them,
    /// so another rank's leaving stops them only where they hold or follow a collective it
    /// never finished (see [`Progress::on_departure`]).
    open: Mutex<OpenGroups>,
    /// Number of the last point-to-point group entered (1-based; 0: none yet). Groups differ
    /// between ranks, so their numbers are this rank's own.
    groups: AtomicU64,
    /// Number of the last point-to-point group ended.
    groups_done: AtomicU64,
    /// Number of the last collective whose kernels ended on this rank's stream (its host
    /// function ran), whether or not the host completed it yet: the stream runs them in
    /// order, so every one before it ended too.
    ended: AtomicU64,
    /// Number of the last point-to-point group whose kernels ended.
    groups_ended: AtomicU64,
}

/// The groups of a rank whose kernels have not ended, and a departure's stop held back until
/// those ahead of the collective it concerns end.
#[derive(Default)]
struct OpenGroups {
    /// Each group's number and the collectives entered once its own were (its own take the
    /// numbers before that), oldest first.
    groups: VecDeque<(u64, u64)>,
    /// The stop: the leaver's last finished collective, and the word that stops this rank's
    /// kernels.
    held: Option<(u64, Weak<HostMapped>)>,
}

impl std::fmt::Debug for OpenGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenGroups")
            .field("groups", &self.groups)
            .field("held", &self.held.as_ref().map(|(d, _)| d))
            .finish()
    }
}

/// A point-to-point group in progress ([`Progress::enter_p2p`]).
#[derive(Debug)]
pub(crate) struct P2pGuard(std::sync::Arc<Progress>, u64);

impl P2pGuard {
    /// The group's number on this rank (1-based).
    pub(crate) fn number(&self) -> u64 {
        self.1
    }
}

impl Drop for P2pGuard {
    fn drop(&mut self) {
        self.0.groups_done.fetch_max(self.1, Ordering::AcqRel);
        self.0.kernels_ended(self.1);
    }
}

/// A collective as a small code for the status answer.
pub(super) fn op_code(coll: Collective, tree: bool) -> u64 {
    coll as u64 * 2 + u64::from(tree)
}

/// The name users know a collective by, for code `c` of [`op_code`].
fn op_name(c: u64) -> &'static str {
    match c {
        0 => "all_reduce",
        1 => "all_reduce(tree)",
        2 | 3 => "reduce_scatter",
        4 | 5 => "all_gather",
        6 | 7 => "broadcast",
        8 | 9 => "reduce",
        _ => "collective",
    }
}

impl Progress {
    /// Enters the next collective; returns its number. A departure's stop held back for the
    /// groups ahead of it is made now if it concerns this one (its kernel, not launched yet,
    /// then stops at its first look).
    pub(crate) fn enter(&self, coll: Collective, tree: bool) -> u64 {
        self.what.store(op_code(coll, tree), Ordering::Relaxed);
        let seq = self.entered.fetch_add(1, Ordering::AcqRel) + 1;
        self.make_held_stop(&mut self.open_groups());
        seq
    }

    /// Enters a point-to-point group holding the next `collectives` collectives (left when the
    /// returned guard drops, or earlier at [`Progress::kernels_ended`]).
    pub(crate) fn enter_p2p(self: &std::sync::Arc<Self>, collectives: u64) -> P2pGuard {
        let number = self.groups.fetch_add(1, Ordering::AcqRel) + 1;
        let end = self.entered.load(Ordering::Acquire) + collectives;
        self.open_groups().groups.push_back((number, end));
        P2pGuard(self.clone(), number)
    }

    fn open_groups(&self) -> std::sync::MutexGuard<'_, OpenGroups> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a rank's departure having finished collectives up to `done` stops this rank's
    /// kernels now (`true`: set `abort`); or not yet, held back until the groups running
    /// ahead of the collective it concerns end ([`Progress::kernels_ended`]); or not at all.
    ///
    /// A departed rank may be no peer of a group, or have done its part (a send's last steps
    /// wait in the receiver's memory): the groups ahead of a collective it never finished go
    /// on. One that holds such a collective, or queues behind it, is stopped with it.
    pub(crate) fn on_departure(&self, done: u64, abort: &Weak<HostMapped>) -> bool {
        let mut open = self.open_groups();
        match self.stop_now(&open, done) {
            Some(now) => now,
            None => {
                if open.held.as_ref().is_none_or(|(d, _)| done < *d) {
                    open.held = Some((done, abort.clone()));
                }
                false
            }
        }
    }

    /// What [`Progress::on_departure`] does: `Some(true)` stop, `Some(false)` nothing, `None`
    /// hold.
    fn stop_now(&self, open: &OpenGroups, left_done: u64) -> Option<bool> {
        match self.concerned_call(open, left_done) {
            Some(unblocked) => unblocked.then_some(true),
            // Nothing waits for the leaver yet: a collective enqueued behind the groups is
            // stopped as it enters or when they end.
            None if !open.groups.is_empty() => None,
            // A rank between arming its word and entering a call checked for departures
            // before this: the armed word stops the call.
            None => Some(self.done.load(Ordering::Acquire) + 1 > left_done),
        }
    }

    /// Whether a collective entered waits for a rank that finished collectives up to
    /// `left_done` (`None`: none does), and then whether no group runs ahead of the first
    /// such (`Some(false)`: one does; it holds none and follows none).
    fn concerned_call(&self, open: &OpenGroups, left_done: u64) -> Option<bool> {
        // The collectives in flight are `done+1 ..= entered`; those past `left_done` wait for
        // the leaver.
        let first = left_done.max(self.done.load(Ordering::Acquire)) + 1;
        (self.entered.load(Ordering::Acquire) >= first)
            .then(|| !open.groups.iter().any(|&(_, end)| end < first))
    }

    /// The kernels of group `number` ended (the host function behind them ran, or the group
    /// completed): a stop held back for the groups is made, if a collective it concerns is in
    /// flight with no group left ahead of it.
    pub(crate) fn kernels_ended(&self, number: u64) {
        self.groups_ended.fetch_max(number, Ordering::AcqRel);
        let mut open = self.open_groups();
        open.groups.retain(|&(n, _)| n != number);
        self.make_held_stop(&mut open);
    }

    /// Makes the stop held back, once a collective it concerns is entered and no group runs
    /// ahead of it. Until then it stays: every later collective needs the leaver (a call
    /// entered after a group ends, racing its own departure check, is stopped here).
    fn make_held_stop(&self, open: &mut OpenGroups) {
        let Some((left_done, _)) = open.held else { return };
        if self.concerned_call(open, left_done) == Some(true) {
            if let Some(abort) = open.held.take().and_then(|(_, a)| a.upgrade()) {
                let _ = abort.store_u32(0, 1);
            }
        }
    }

    /// The kernels of collective `seq` ended (its host function ran).
    pub(crate) fn collective_ended(&self, seq: u64) {
        self.ended.fetch_max(seq, Ordering::AcqRel);
    }

    /// Marks collective `seq` finished.
    pub(crate) fn finish(&self, seq: u64) {
        self.done.fetch_max(seq, Ordering::AcqRel);
    }

    /// Marks collective `seq` failed (and finished): the others' reports tell it from a success.
    pub(crate) fn fail(&self, seq: u64) {
        self.failed.fetch_max(seq, Ordering::AcqRel);
        self.finish(seq);
    }

    /// Number the next collective entered gets.
    pub(crate) fn next(&self) -> u64 {
        self.entered.load(Ordering::Acquire) + 1
    }

    /// Number of the last collective finished (0: none).
    pub(crate) fn done(&self) -> u64 {
        self.done.load(Ordering::Acquire)
    }

    /// Number of the last collective this rank finished before any failed: its peers may still
    /// complete those without it, not the later ones.
    pub(crate) fn done_before_failure(&self) -> u64 {
        match self.failed.load(Ordering::Acquire) {
            0 => self.done(),
            f => self.done().min(f - 1),
        }
    }

    /// The last collective entered, if it has not finished yet: (its number, what it is).
    /// With several calls in flight, the earlier ones are between `done` and it.
    pub(crate) fn in_flight(&self) -> Option<(u64, u64)> {
        let entered = self.entered.load(Ordering::Acquire);
        (entered > self.done.load(Ordering::Acquire)).then(|| (entered, self.what.load(Ordering::Relaxed)))
    }

    /// The status answer: `rsccl-progress entered done what failed groups groups_done ended
    /// groups_ended`.
    pub(crate) fn encode(&self) -> Vec<u8> {
        format!(
            "rsccl-progress {} {} {} {} {} {} {} {}",
            self.entered.load(Ordering::Acquire),
            self.done.load(Ordering::Acquire),
            self.what.load(Ordering::Relaxed),
            self.failed.load(Ordering::Acquire),
            self.groups.load(Ordering::Acquire),
            self.groups_done.load(Ordering::Acquire),
            self.ended.load(Ordering::Acquire),
            self.groups_ended.load(Ordering::Acquire)
        )
        .into_bytes()
    }
}

/// A rank's answer, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RankState {
    pub entered: u64,
    pub done: u64,
    pub what: u64,
    /// The last collective that failed there (0: none).
    pub failed: u64,
    /// The last point-to-point group entered there (its own numbering).
    pub groups: u64,
    /// The last point-to-point group ended there.
    pub groups_done: u64,
    /// The last collective whose kernels ended there (the host may not have completed it).
    pub ended: u64,
    /// The last point-to-point group whose kernels ended there.
    pub groups_ended: u64,
}

impl RankState {
    /// Reads an answer; `None` for anything that is not one.
    pub(crate) fn decode(b: &[u8]) -> Option<RankState> {
        let s = std::str::from_utf8(b).ok()?;
        let mut it = s.strip_prefix("rsccl-progress ")?.split(' ');
        let mut num = || it.next()?.parse::<u64>().ok();
        let st = RankState {
            entered: num()?,
            done: num()?,
            what: num()?,
            failed: num()?,
            groups: num()?,
            groups_done: num()?,
            ended: num()?,
            groups_ended: num()?,
        };
        let ordered = st.done <= st.entered
            && st.failed <= st.done
            && st.groups_done <= st.groups
            && st.ended <= st.entered
            && st.groups_ended <= st.groups;
        (ordered && it.next().is_none()).then_some(st)
    }
}

/// "0–4, 6, 8–9".
pub(crate) fn ranges(ranks: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if i == j { ranks[i].to_string() } else { format!("{}–{}", ranks[i], ranks[j]) });
        i = j + 1;
    }
    out.join(", ")
}

fn plural(ranks: &[usize]) -> String {
    format!("{} {}", if ranks.len() == 1 { "rank" } else { "ranks" }, ranges(ranks))
}

/// The report for rank `me`, whose collective `seq` (`what`, as [`Progress::in_flight`] gives
/// it) timed out, from every rank's answer: a headline naming who is behind, and a line per rank.
pub(crate) fn report(
    me: usize,
    seq: u64,
    what: u64,
    answers: &[Result<Vec<u8>, String>],
) -> (String, Vec<String>) {
    let name = op_name(what);
    let (mut behind, mut inside, mut past, mut silent) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut failed, mut other) = (Vec::new(), Vec::new());
    let mut lines = Vec::with_capacity(answers.len());
    for (r, a) in answers.iter().enumerate() {
        let st = match a {
            Ok(b) => {
                RankState::decode(b).ok_or_else(|| "answered something that is not a status".to_string())
            }
            Err(e) => Err(e.clone()),
        };
        let line = match st {
            Err(why) => {
                silent.push(r);
                format!("rank {r}: no answer ({why})")
            }
            Ok(s) if s.entered < seq => {
                behind.push(r);
                let at = if s.entered > s.done {
                    format!("in {} #{}", op_name(s.what), s.entered)
                } else {
                    "between collectives".to_string()
                };
                format!("rank {r}: never entered {name} #{seq}: {at}, last completed #{}", s.done)
            }
            // Each rank is named by the collective it entered as #seq, which may not be ours.
            Ok(s) if s.entered == seq && s.what != what => {
                other.push((r, s.what));
                let state = if s.done < seq {
                    "waits in"
                } else if s.failed == seq {
                    "failed"
                } else {
                    "finished"
                };
                format!("rank {r}: {state} {} #{seq}, not {name}", op_name(s.what))
            }
            Ok(s) if s.done < seq => {
                inside.push(r);
                format!("rank {r}: waits in {name} #{seq}{}", if r == me { " (this rank)" } else { "" })
            }
            Ok(s) if s.failed >= seq => {
                failed.push(r);
                format!("rank {r}: failed {name} #{seq}, last completed #{}", s.done)
            }
            Ok(s) => {
                past.push(r);
                format!("rank {r}: finished {name} #{seq}, last completed #{}", s.done)
            }
        };
        lines.push(line);
    }
    let headline = if !other.is_empty() {
        // Mismatched calls: the ranks disagree on what collective #seq is.
        let mut names: Vec<u64> = other.iter().map(|&(_, w)| w).collect();
        names.sort_unstable();
        names.dedup();
        let groups: Vec<String> = names
            .iter()
            .map(|&w| {
                let rs: Vec<usize> = other.iter().filter(|&&(_, x)| x == w).map(|&(r, _)| r).collect();
                format!("{} called {}", plural(&rs), op_name(w))
            })
            .collect();
        let ours: Vec<usize> = (0..answers.len()).filter(|r| !other.iter().any(|&(o, _)| o == *r)).collect();
        let ours: Vec<usize> =
            ours.into_iter().filter(|r| !behind.contains(r) && !silent.contains(r)).collect();
        format!(
            "the ranks called different collectives as #{seq}: {}, {} called {name}",
            groups.join(", "),
            plural(&ours)
        )
    } else if !behind.is_empty() {
        format!(
            "{} never entered {name} #{seq}; {} {} in it",
            plural(&behind),
            plural(&inside),
            if inside.len() == 1 { "waits" } else { "wait" }
        )
    } else if !silent.is_empty() {
        format!("{} did not answer; {} wait in {name} #{seq}", plural(&silent), plural(&inside))
    } else {
        format!(
            "every rank entered {name} #{seq}; {} still wait in it{} (a peer too slow for the timeout, or a lost connection)",
            plural(&inside),
            if past.is_empty() { String::new() } else { format!(", {} finished it", plural(&past)) }
        ) + &if failed.is_empty() { String::new() } else { format!(", {} failed it", plural(&failed)) }
    };
    (headline, lines)
}

/// For a point-to-point group that timed out waiting for `peers`: where each of them is, a
/// line each ("rank 1: in no point-to-point group (last ended #2), between collectives (last
/// completed #7)"), from every rank's answer.
pub(crate) fn p2p_lines(peers: &[usize], answers: &[Result<Vec<u8>, String>]) -> Vec<String> {
    peers
        .iter()
        .map(|&r| {
            let st = match answers.get(r) {
                Some(Ok(b)) => {
                    RankState::decode(b).ok_or_else(|| "answered something that is not a status".into())
                }
                Some(Err(e)) => Err(e.clone()),
                None => Err("not asked".to_string()),
            };
            match st {
                Err(why) => format!("rank {r}: no answer ({why})"),
                Ok(s) => {
                    let group = if s.groups > s.groups_done {
                        format!("in its point-to-point group #{}", s.groups)
                    } else if s.groups == 0 {
                        "in no point-to-point group (none yet)".to_string()
                    } else {
                        format!("in no point-to-point group (last ended #{})", s.groups_done)
                    };
                    let coll = if s.entered > s.done {
                        format!("in {} #{}", op_name(s.what), s.entered)
                    } else {
                        format!("between collectives (last completed #{})", s.done)
                    };
                    format!("rank {r}: {group}, {coll}")
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_round_trips_and_garbage_is_refused() {
        let p = std::sync::Arc::new(Progress::default());
        assert_eq!(p.enter(Collective::Broadcast, false), 1);
        assert_eq!(p.in_flight(), Some((1, op_code(Collective::Broadcast, false))));
        p.finish(1);
        assert_eq!(p.in_flight(), None);
        assert_eq!(p.enter(Collective::AllReduce, true), 2);
        assert_eq!(
            RankState::decode(&p.encode()),
            Some(RankState {
                entered: 2,
                done: 1,
                what: 1,
                failed: 0,
                groups: 0,
                groups_done: 0,
                ended: 0,
                groups_ended: 0
            })
        );
        p.fail(2);
        assert_eq!(
            RankState::decode(&p.encode()),
            Some(RankState {
                entered: 2,
                done: 2,
                what: 1,
                failed: 2,
                groups: 0,
                groups_done: 0,
                ended: 0,
                groups_ended: 0
            })
        );
        let g = p.enter_p2p(0);
        assert_eq!(g.number(), 1);
        assert_eq!(RankState::decode(&p.encode()).map(|s| (s.groups, s.groups_done)), Some((1, 0)));
        drop(g);
        assert_eq!(RankState::decode(&p.encode()).map(|s| (s.groups, s.groups_done)), Some((1, 1)));
        p.collective_ended(2);
        assert_eq!(RankState::decode(&p.encode()).map(|s| (s.ended, s.groups_ended)), Some((2, 1)));
        for bad in [
            &b""[..],
            b"rsccl-progress",
            b"rsccl-progress 1 2 0 0 0 0 0 0",
            b"rsccl-progress 2 1 0 2 0 0 0 0",
            b"rsccl-progress 2 1 0 0 1 2 0 0",
            b"rsccl-progress 2 1 0 0 0 0 3 0",
            b"rsccl-progress 2 1 0 0 1 0 0 2",
            b"rsccl-progress 2 1 0 0",
            b"rsccl-progress 2 1 0 0 0",
            b"rsccl-progress 2 1 0 0 0 0 0",
            b"rsccl-progress 2 1 0 0 0 0 0 0 0",
            b"x 1 1 1",
            b"rsccl-progress 1 a 0",
            &[0xff; 9],
        ] {
            assert_eq!(RankState::decode(bad), None, "{bad:?}");
        }
        assert_eq!(ranges(&[0, 1, 2, 3, 4, 6, 7, 9]), "0–4, 6–7, 9");
    }

    #[test]
    fn the_rank_that_never_came_is_named_first() {
        let st = |e: u64, d: u64| Ok(format!("rsccl-progress {e} {d} 0 0 0 0 0 0").into_bytes());
        let mut answers: Vec<Result<Vec<u8>, String>> = (0..8).map(|_| st(812, 811)).collect();
        answers[5] = st(811, 811);
        let (head, lines) = report(0, 812, op_code(Collective::AllReduce, false), &answers);
        assert_eq!(head, "rank 5 never entered all_reduce #812; ranks 0–4, 6–7 wait in it");
        assert_eq!(
            lines[5],
            "rank 5: never entered all_reduce #812: between collectives, last completed #811"
        );
        assert_eq!(lines[0], "rank 0: waits in all_reduce #812 (this rank)");
        answers[5] = Err("no answer within 2 s".into());
        let (head, _) = report(0, 812, op_code(Collective::AllReduce, false), &answers);
        assert_eq!(head, "rank 5 did not answer; ranks 0–4, 6–7 wait in all_reduce #812");
        answers[5] = st(812, 812);
        let (head, _) = report(1, 812, op_code(Collective::AllReduce, false), &answers);
        assert!(
            head.starts_with(
                "every rank entered all_reduce #812; ranks 0–4, 6–7 still wait in it, rank 5 finished it"
            ),
            "{head}"
        );
        // A rank whose call failed is not counted as finished.
        answers[5] = Ok(b"rsccl-progress 812 812 0 812 0 0 0 0".to_vec());
        let (head, lines) = report(1, 812, op_code(Collective::AllReduce, false), &answers);
        assert!(head.ends_with(", rank 5 failed it"), "{head}");
        assert_eq!(lines[5], "rank 5: failed all_reduce #812, last completed #812");
    }

    /// Rank 0 in a tree all-reduce, ranks 1-2 in a ring all-reduce, all as #1: each rank is
    /// named by the collective it called (it used to read "every rank entered all_reduce #1").
    #[test]
    fn ranks_in_different_collectives_are_named_by_theirs() {
        let tree = op_code(Collective::AllReduce, true);
        let ring = op_code(Collective::AllReduce, false);
        let answers: Vec<Result<Vec<u8>, String>> = [tree, ring, ring]
            .iter()
            .map(|w| Ok(format!("rsccl-progress 1 0 {w} 0 0 0 0 0").into_bytes()))
            .collect();
        let (head, lines) = report(1, 1, ring, &answers);
        assert_eq!(head, "the ranks called different collectives as #1: rank 0 called all_reduce(tree), ranks 1–2 called all_reduce");
        assert_eq!(lines[0], "rank 0: waits in all_reduce(tree) #1, not all_reduce");
        assert_eq!(lines[1], "rank 1: waits in all_reduce #1 (this rank)");
    }

    #[test]
    fn a_point_to_point_timeout_says_where_each_peer_is() {
        let answers: Vec<Result<Vec<u8>, String>> = vec![
            Ok(b"rsccl-progress 3 3 0 0 2 1 0 0".to_vec()),
            Ok(b"rsccl-progress 3 3 0 0 1 1 0 0".to_vec()),
            Ok(b"rsccl-progress 4 3 4 0 0 0 0 0".to_vec()),
            Err("no answer within 2 s".into()),
        ];
        assert_eq!(
            p2p_lines(&[1, 2, 3], &answers),
            [
                "rank 1: in no point-to-point group (last ended #1), between collectives (last completed #3)",
                "rank 2: in no point-to-point group (none yet), in all_gather #4",
                "rank 3: no answer (no answer within 2 s)",
            ]
        );
        assert_eq!(
            p2p_lines(&[0], &answers),
            ["rank 0: in its point-to-point group #2, between collectives (last completed #3)"]
        );
    }
}

//! What each benchmark runs, in nccl-tests' terms: element counts and in-place offsets per
//! collective (`*GetCollByteCount`), the bytes the size column and algbw count, and the bus
//! bandwidth factor (`*GetBw`).

/// All-gather and reduce-scatter counts are multiples of this per rank (nccl-tests' `ALIGN`).
pub const ALIGN: usize = 4;

/// A benchmark: one of nccl-tests' collective tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PerfCollective {
    /// `all_reduce_perf`.
    AllReduce,
    /// `all_gather_perf`.
    AllGather,
    /// `reduce_scatter_perf`.
    ReduceScatter,
    /// `broadcast_perf`.
    Broadcast,
    /// `reduce_perf`.
    Reduce,
    /// `alltoall_perf`.
    AllToAll,
    /// `sendrecv_perf`: each rank sends to the next and receives from the previous.
    SendRecv,
    /// `gather_perf`.
    Gather,
    /// `scatter_perf`.
    Scatter,
    /// `hypercube_perf`: an all-gather by pairwise exchanges with `rank ^ 2^k` (a power-of-two
    /// rank count).
    HyperCube,
}

/// The element counts of one step of a benchmark, for one rank (nccl-tests' `setupArgs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Elements each rank sends.
    pub send_count: usize,
    /// Elements each rank receives (and checks).
    pub recv_count: usize,
    /// The count passed to the collective (the table's `count` column).
    pub param_count: usize,
    /// In place, rank r's send buffer starts `r × send_inplace_offset` elements into its
    /// receive buffer.
    pub send_inplace_offset: usize,
    /// In place, rank r's receive buffer starts `r × recv_inplace_offset` elements into it.
    pub recv_inplace_offset: usize,
}

impl PerfCollective {
    /// Every benchmark, in the order `rsccl perf --help` lists them.
    pub const ALL: [PerfCollective; 10] = [
        PerfCollective::AllReduce,
        PerfCollective::AllGather,
        PerfCollective::ReduceScatter,
        PerfCollective::Broadcast,
        PerfCollective::Reduce,
        PerfCollective::AllToAll,
        PerfCollective::SendRecv,
        PerfCollective::Gather,
        PerfCollective::Scatter,
        PerfCollective::HyperCube,
    ];

    /// The command-line name (nccl-tests' binary without `_perf`).
    pub fn name(self) -> &'static str {
        match self {
            PerfCollective::AllReduce => "all_reduce",
            PerfCollective::AllGather => "all_gather",
            PerfCollective::ReduceScatter => "reduce_scatter",
            PerfCollective::Broadcast => "broadcast",
            PerfCollective::Reduce => "reduce",
            PerfCollective::AllToAll => "alltoall",
            PerfCollective::SendRecv => "sendrecv",
            PerfCollective::Gather => "gather",
            PerfCollective::Scatter => "scatter",
            PerfCollective::HyperCube => "hypercube",
        }
    }

    /// Parses a name, with or without nccl-tests' `_perf` suffix.
    pub fn from_name(s: &str) -> Option<PerfCollective> {
        let s = s.strip_suffix("_perf").unwrap_or(s);
        Self::ALL.into_iter().find(|c| c.name() == s)
    }

    /// Whether the collective reduces (takes `-o`); the others print `none` as their op.
    pub fn reduces(self) -> bool {
        matches!(self, PerfCollective::AllReduce | PerfCollective::ReduceScatter | PerfCollective::Reduce)
    }

    /// Whether the collective has a root (takes `-r`); the others print `-1` as their root.
    pub fn rooted(self) -> bool {
        matches!(
            self,
            PerfCollective::Broadcast
                | PerfCollective::Reduce
                | PerfCollective::Gather
                | PerfCollective::Scatter
        )
    }

    /// The counts for a step of `count` elements (the size in bytes over the type size) on
    /// `nranks` ranks. All-gather and reduce-scatter round the per-rank count down to a
    /// multiple of [`ALIGN`] so that `nranks` blocks fit in `count`.
    pub fn shape(self, count: usize, nranks: usize) -> Shape {
        match self {
            PerfCollective::AllReduce
            | PerfCollective::Broadcast
            | PerfCollective::Reduce
            | PerfCollective::SendRecv => Shape {
                send_count: count,
                recv_count: count,
                param_count: count,
                send_inplace_offset: 0,
                recv_inplace_offset: 0,
            },
            PerfCollective::AllGather | PerfCollective::Gather | PerfCollective::HyperCube => {
                let base = count / (ALIGN * nranks) * ALIGN;
                Shape {
                    send_count: base,
                    recv_count: base * nranks,
                    param_count: base,
                    send_inplace_offset: base,
                    recv_inplace_offset: 0,
                }
            }
            PerfCollective::ReduceScatter | PerfCollective::Scatter => {
                let base = count / (ALIGN * nranks) * ALIGN;
                Shape {
                    send_count: base * nranks,
                    recv_count: base,
                    param_count: base,
                    send_inplace_offset: 0,
                    recv_inplace_offset: base,
                }
            }
            PerfCollective::AllToAll => {
                let base = count / (ALIGN * nranks) * ALIGN;
                Shape {
                    send_count: base * nranks,
                    recv_count: base * nranks,
                    param_count: base,
                    send_inplace_offset: 0,
                    recv_inplace_offset: 0,
                }
            }
        }
    }

    /// Algorithm and bus bandwidth in GB/s of a step that took `sec` seconds: algbw counts
    /// the whole buffer (`count × nranks` for all-gather, reduce-scatter and all-to-all, whose `count` is
    /// per rank), busbw scales it by what each rank's links carry (nccl-tests' `GetBw`).
    pub fn bandwidth(self, param_count: usize, type_size: usize, sec: f64, nranks: usize) -> (f64, f64) {
        let n = nranks as f64;
        let (bytes, factor) = match self {
            PerfCollective::AllReduce => (param_count * type_size, 2.0 * (n - 1.0) / n),
            PerfCollective::AllGather
            | PerfCollective::ReduceScatter
            | PerfCollective::AllToAll
            | PerfCollective::Gather
            | PerfCollective::Scatter => (param_count * type_size * nranks, (n - 1.0) / n),
            PerfCollective::Broadcast | PerfCollective::Reduce | PerfCollective::SendRecv => {
                (param_count * type_size, 1.0)
            }
            PerfCollective::HyperCube => (param_count * type_size * nranks.saturating_sub(1), 1.0),
        };
        let algbw = bytes as f64 / 1.0e9 / sec;
        (algbw, algbw * factor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_follow_nccl_tests() {
        // 1000 elements over 3 ranks: blocks of 332 (996 is the largest multiple of 4 × 3).
        let ag = PerfCollective::AllGather.shape(1000, 3);
        assert_eq!((ag.send_count, ag.recv_count, ag.param_count), (332, 996, 332));
        assert_eq!(ag.send_inplace_offset, 332);
        let rs = PerfCollective::ReduceScatter.shape(1000, 3);
        assert_eq!((rs.send_count, rs.recv_count, rs.recv_inplace_offset), (996, 332, 332));
        let ar = PerfCollective::AllReduce.shape(7, 3);
        assert_eq!((ar.send_count, ar.recv_count, ar.param_count), (7, 7, 7));
        let a2a = PerfCollective::AllToAll.shape(1000, 3);
        assert_eq!((a2a.send_count, a2a.recv_count, a2a.param_count), (996, 996, 332));
        assert_eq!((a2a.send_inplace_offset, a2a.recv_inplace_offset), (0, 0));
        // Too few elements for every rank: nothing moves.
        assert_eq!(PerfCollective::AllGather.shape(8, 3).recv_count, 0);
    }

    #[test]
    fn bus_bandwidth_factors() {
        let bw = |c: PerfCollective| c.bandwidth(1_000_000, 4, 1e-3, 4);
        assert_eq!(bw(PerfCollective::AllReduce), (4.0, 6.0));
        assert_eq!(bw(PerfCollective::AllGather), (16.0, 12.0));
        assert_eq!(bw(PerfCollective::ReduceScatter), (16.0, 12.0));
        assert_eq!(bw(PerfCollective::Broadcast), (4.0, 4.0));
        assert_eq!(bw(PerfCollective::Reduce), (4.0, 4.0));
        assert_eq!(bw(PerfCollective::AllToAll), (16.0, 12.0));
        assert_eq!(bw(PerfCollective::Gather), (16.0, 12.0));
        assert_eq!(bw(PerfCollective::Scatter), (16.0, 12.0));
        assert_eq!(bw(PerfCollective::SendRecv), (4.0, 4.0));
        assert_eq!(bw(PerfCollective::HyperCube), (12.0, 12.0));
        let sc = PerfCollective::Scatter.shape(1000, 3);
        assert_eq!(
            (sc.send_count, sc.recv_count, sc.param_count, sc.recv_inplace_offset),
            (996, 332, 332, 332)
        );
        let ga = PerfCollective::Gather.shape(1000, 3);
        assert_eq!(
            (ga.send_count, ga.recv_count, ga.param_count, ga.send_inplace_offset),
            (332, 996, 332, 332)
        );
        assert_eq!(PerfCollective::from_name("alltoall_perf"), Some(PerfCollective::AllToAll));
        assert_eq!(PerfCollective::from_name("all_reduce_perf"), Some(PerfCollective::AllReduce));
        assert_eq!(PerfCollective::from_name("allreduce"), None);
    }
}

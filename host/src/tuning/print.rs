//! The cost table and the choices in text: [`CostTable::render`] prints the table as NCCL's
//! `NCCL_DEBUG_SUBSYS=TUNING` does (blocks of three algorithms; per collective a row of
//! `latency/bandwidth` cells, one per protocol), [`render_enabled`] the per-collective enable
//! matrix NCCL prints when `NCCL_ALGO` or `NCCL_PROTO` is set, and [`render_sweep`] the
//! choice at each size of a sweep.

use super::env::{Enabled, ProtoSetting};
use super::names::{Algo, Coll, Proto};
use super::table::CostTable;
use crate::error::Result;
use std::fmt::{self, Write as _};

/// Algorithms per block of the table, as NCCL prints them.
const ALGOS_PER_BLOCK: usize = 3;

impl CostTable {
    /// The table in NCCL's TUNING format: per block of three algorithms a header (algorithm,
    /// protocol, max threads) and one row per collective, each cell `latency/bandwidth` (µs,
    /// GB/s, `%8.1f/%6.1f`). A cell `enabled` turns off (or LL128 where it is not safe) shows
    /// bandwidth 0.0, as NCCL's does; a cell the model has no entry for shows `-/-`.
    ///
    /// ```
    /// use rsccl::tuning::{AlgoGraphs, CostTable, CpuKind, Enabled, GraphInput, TuningInput};
    /// let input = TuningInput {
    ///     nranks: 8, nnodes: 1, sm_min: 90, sm_max: 90, cpu: CpuKind::Intel,
    ///     comm_channels: 24, nvls_channels: 0, nvls: false, coll_net: false,
    ///     graphs: AlgoGraphs {
    ///         ring: GraphInput::nvlink(12, 30.0),
    ///         tree: GraphInput::nvlink(12, 30.0),
    ///         coll_net_direct: GraphInput::none(),
    ///         coll_net_chain: GraphInput::none(),
    ///         nvls: GraphInput::none(),
    ///     },
    /// };
    /// let text = CostTable::build(&input)?.render(&Enabled::all());
    /// let row = text.lines().find(|l| l.trim_start().starts_with("AllReduce")).unwrap();
    /// assert!(row.contains("    15.0/  80.6 |")); // ring LL: 6.6 + 14 x 0.6 us, 141 x 8/14 GB/s
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn render(&self, enabled: &Enabled) -> String {
        let mut out = String::new();
        for block in Algo::ALL.chunks(ALGOS_PER_BLOCK) {
            let mut line = String::from("  Algorithm   |");
            for a in block {
                let _ = write!(line, " {:>14}   {:>14}   {:>14} |", "", a.name(), "");
            }
            out.push_str(line.trim_end());
            out.push('\n');
            let mut line = String::from("  Protocol    |");
            for _ in block {
                for p in Proto::ALL {
                    let _ = write!(line, " {:>14} |", p.name());
                }
            }
            out.push_str(&line);
            out.push('\n');
            let mut line = String::from(" Max NThreads |");
            for &a in block {
                for p in Proto::ALL {
                    match self.max_threads(a, p) {
                        Some(n) => {
                            let _ = write!(line, " {n:>14} |");
                        }
                        None => {
                            let _ = write!(line, " {:>14} |", "-");
                        }
                    }
                }
            }
            out.push_str(&line);
            out.push('\n');
            for c in Coll::ALL {
                let mut line = format!("{:>13} |", c.name());
                for &a in block {
                    for p in Proto::ALL {
                        match self.get(c, a, p) {
                            Some(e) => {
                                let bw = if self.allows(enabled, c, a, p) { e.bandwidth_gbps } else { 0.0 };
                                let _ = write!(line, "{:>8.1}/{:>6.1} |", e.latency_us, bw);
                            }
                            None => {
                                let _ = write!(line, "{:>8}/{:>6} |", "-", "-");
                            }
                        }
                    }
                }
                out.push_str(&line);
                out.push('\n');
            }
        }
        out
    }
}

impl fmt::Display for CostTable {
    /// [`CostTable::render`] with everything enabled.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(&Enabled::all()))
    }
}

/// NCCL's "Enabled Func/Proto/Algo Matrix": per collective 0 (off), 1 (on) or 2 (LL128 left
/// to its default) per protocol, and 0/1 per algorithm.
pub fn render_enabled(enabled: &Enabled) -> String {
    let mut out = String::from("     Function | ");
    for p in Proto::ALL {
        let _ = write!(out, "{:>8}  ", p.name());
    }
    out.push_str(" | ");
    for a in Algo::ALL {
        let _ = write!(out, "{:>13}  ", a.name());
    }
    out = out.trim_end().to_string();
    out.push('\n');
    for c in Coll::ALL {
        let mut line = format!("{:>13} | ", c.name());
        for p in Proto::ALL {
            let v = match enabled.proto(c, p) {
                ProtoSetting::Off => 0,
                ProtoSetting::On => 1,
                ProtoSetting::Auto => 2,
            };
            let _ = write!(line, "{v:>8}  ");
        }
        line.push_str(" | ");
        for a in Algo::ALL {
            let _ = write!(line, "{:>13}  ", u8::from(enabled.algo(c, a)));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The choice for `coll` at each of `sizes` (bytes): a header line, then per size the
/// algorithm, protocol, channels, threads and predicted time. Fails as
/// [`CostTable::choose`] does.
pub fn render_sweep(table: &CostTable, coll: Coll, sizes: &[u64], enabled: &Enabled) -> Result<String> {
    render_sweep_with(table, coll, sizes, enabled, None)
}

/// [`render_sweep`] with a tuner plugin's `session` asked at each size
/// ([`CostTable::choose_with`]).
pub fn render_sweep_with(
    table: &CostTable,
    coll: Coll,
    sizes: &[u64],
    enabled: &Enabled,
    session: Option<&super::plugin::Session>,
) -> Result<String> {
    let mut out = format!(
        "{coll} on {} rank(s), {} node(s):\n{:>14}  {:<13}  {:<8}  {:>8}  {:>7}  {:>12}  {:>10}\n",
        table.nranks(),
        table.nnodes(),
        "bytes",
        "algorithm",
        "protocol",
        "channels",
        "threads",
        "time (us)",
        "algbw GB/s"
    );
    for &bytes in sizes {
        let c = table.choose_with(coll, bytes, enabled, session)?;
        // Algorithm bandwidth of the prediction (bytes per ns); none for a free call.
        let rate = if c.time_us > 0.0 { bytes as f64 / (1000.0 * c.time_us) } else { 0.0 };
        let _ = writeln!(
            out,
            "{bytes:>14}  {:<13}  {:<8}  {:>8}  {:>7}  {:>12.2}  {rate:>10.2}",
            c.algo.name(),
            c.proto.name(),
            c.nchannels,
            c.nthreads,
            c.time_us
        );
    }
    Ok(out)
}

//! `rsccl perf`: the nccl-tests benchmarks (`all_reduce_perf`, `all_gather_perf`,
//! `reduce_scatter_perf`, `broadcast_perf`, `reduce_perf`) on rsccl's communicators, with
//! nccl-tests' flags and its output byte for byte, so that scripts written for nccl-tests read
//! ours.
//!
//! - [`args`]: the command line (nccl-tests' flags and defaults) → [`PerfOptions`].
//! - [`coll`]: what each benchmark runs: counts, buffer offsets and bandwidth factors as
//!   nccl-tests' `GetCollByteCount` / `GetBw` define them.
//! - [`data`]: each rank's input pattern and the host reference its output is checked against.
//! - [`table`]: the text of the report (header, rank lines, columns, rows, footer).
//! - [`run`]: the benchmark itself: ranks as threads (`-g N`) or one per process under a
//!   launcher, warmup, timed iterations, checks, aggregation across ranks.
//! - [`cli`]: `rsccl perf COLLECTIVE [FLAGS]`.
//!
//! ```no_run
//! use rsccl::perf::{args::parse, run::execute};
//!
//! let opts = parse(&["all_reduce", "-g", "2", "-b", "8", "-e", "1M", "-f", "2"].map(String::from))?
//!     .expect("not --help");
//! let summary = execute(&opts, &mut std::io::stdout())?;
//! println!("average bus bandwidth {:.3} GB/s", summary.avg_busbw);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
pub mod args;
pub mod cli;
pub mod coll;
pub mod data;
pub mod run;
pub mod table;

pub use args::{Average, PerfOp, PerfOptions};
pub use coll::PerfCollective;
pub use run::{execute, Summary};

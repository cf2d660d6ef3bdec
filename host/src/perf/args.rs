//! The command line of `rsccl perf`: nccl-tests' flags (`common.cu`), their defaults and
//! their size syntax, checked strictly: where nccl-tests falls back to a default on a bad
//! value (`-d`, `-o`) or reads garbage as 0 (`strtol`), this refuses the command line.
use super::coll::PerfCollective;
use crate::comm::{ReduceOp, MAX_CHANNELS};
use rsccl_device::dtype::DataType;
use std::time::Duration;

/// The data types in nccl-tests' order, with its names (`test_typenames`).
pub const TYPES: [(&str, DataType); 12] = [
    ("int8", DataType::I8),
    ("uint8", DataType::U8),
    ("int32", DataType::I32),
    ("uint32", DataType::U32),
    ("int64", DataType::I64),
    ("uint64", DataType::U64),
    ("half", DataType::F16),
    ("float", DataType::F32),
    ("double", DataType::F64),
    ("bfloat16", DataType::BF16),
    ("f8e4m3", DataType::Fp8E4M3),
    ("f8e5m2", DataType::Fp8E5M2),
];

/// nccl-tests' name of a data type.
pub fn type_name(t: DataType) -> &'static str {
    TYPES.iter().find(|(_, d)| *d == t).map(|(n, _)| *n).expect("every DataType has a name")
}

/// A reduction as nccl-tests names and runs it (`test_opnames`, `test_ops`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PerfOp {
    /// `sum`.
    Sum,
    /// `prod`.
    Prod,
    /// `max`.
    Max,
    /// `min`.
    Min,
    /// `avg`.
    Avg,
    /// `mulsum`: PreMulSum with each rank's own scalar, 1 on even ranks and 2 on odd ones
    /// (nccl-tests' `ncclVerifiablePremulScalar`).
    MulSum,
}

impl PerfOp {
    /// Every op in nccl-tests' order (`-o all`).
    pub const ALL: [PerfOp; 6] =
        [PerfOp::Sum, PerfOp::Prod, PerfOp::Max, PerfOp::Min, PerfOp::Avg, PerfOp::MulSum];

    /// The name in the table's `redop` column.
    pub fn name(self) -> &'static str {
        match self {
            PerfOp::Sum => "sum",
            PerfOp::Prod => "prod",
            PerfOp::Max => "max",
            PerfOp::Min => "min",
            PerfOp::Avg => "avg",
            PerfOp::MulSum => "mulsum",
        }
    }

    /// Parses a name; `premulsum` is accepted for `mulsum`.
    pub fn from_name(s: &str) -> Option<PerfOp> {
        if s == "premulsum" {
            return Some(PerfOp::MulSum);
        }
        Self::ALL.into_iter().find(|o| o.name() == s)
    }

    /// The PreMulSum scalar of `rank` (1 for every other op).
    pub fn scalar(self, rank: usize) -> f64 {
        match self {
            PerfOp::MulSum if rank % 2 == 1 => 2.0,
            _ => 1.0,
        }
    }

    /// The operator `rank` passes to the collective.
    pub fn reduce_op(self, rank: usize) -> ReduceOp {
        match self {
            PerfOp::Sum => ReduceOp::Sum,
            PerfOp::Prod => ReduceOp::Prod,
            PerfOp::Max => ReduceOp::Max,
            PerfOp::Min => ReduceOp::Min,
            PerfOp::Avg => ReduceOp::Avg,
            PerfOp::MulSum => ReduceOp::PreMulSum(self.scalar(rank)),
        }
    }
}

/// How the ranks' times combine into the reported one (nccl-tests' `-a`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Average {
    /// Rank 0's time (`-a 0`).
    Rank0,
    /// The mean over ranks (`-a 1`, the default).
    Mean,
    /// The fastest rank (`-a 2`).
    Min,
    /// The slowest rank (`-a 3`).
    Max,
}

/// Most calls `-m` puts in one timed iteration: each is a group's collective (or a send and a
/// receive), held until the group runs, so the group stays within the point-to-point limit.
pub const MAX_AGG_ITERS: usize = crate::comm::MAX_P2P_OPS / 2;

/// Everything a run of `rsccl perf` is asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct PerfOptions {
    /// The benchmark.
    pub collective: PerfCollective,
    /// Threads per process (`-t`); only 1 is supported.
    pub nthreads: usize,
    /// Ranks in this process (`-g`); 1 under a launcher.
    pub ngpus: usize,
    /// The first size in bytes (`-b`).
    pub min_bytes: u64,
    /// The last size in bytes at most (`-e`).
    pub max_bytes: u64,
    /// The size increment when `step_factor` is 1 (`-i`).
    pub step_bytes: u64,
    /// The size multiplier; 1 means add `step_bytes` instead (`-f`).
    pub step_factor: u64,
    /// Timed iterations per size (`-n`).
    pub iters: usize,
    /// Collectives per timed iteration (`-m`, at most [`MAX_AGG_ITERS`]): one group when over 1.
    pub agg_iters: usize,
    /// Untimed iterations before the sizes, at the largest and the smallest size (`-w`).
    pub warmup_iters: usize,
    /// Checked runs after each timing (`-c`); 0 reports `N/A` wrong values.
    pub check: usize,
    /// The data types to run, in order (`-d`; `all` is every type).
    pub dtypes: Vec<DataType>,
    /// Whether `-d all` chose the types (FP8 is then left out on GPUs below sm_90, as
    /// nccl-tests does).
    pub all_types: bool,
    /// The reductions to run, in order (`-o`); ignored by all-gather and broadcast.
    pub ops: Vec<PerfOp>,
    /// The root (`-r`); `None` runs every rank as root in turn (`-r all` or `-r -1`).
    pub root: Option<usize>,
    /// How per-rank times combine (`-a`).
    pub average: Average,
    /// Label the time column `cputime` (`-C 1`; the collectives are synchronous, so the two
    /// times are the same).
    pub report_cputime: bool,
    /// Ring channels (`--channels`, else `RSCCL_NCHANNELS`, else the communicator's default).
    pub nchannels: Option<usize>,
    /// How long a collective may wait for a peer (`-T` seconds; 0 or unset: the default).
    pub timeout: Option<Duration>,
    /// The protocols allowed (`-p`/`--proto`, `RSCCL_PROTO`'s syntax: `LL`, `Simple`, `^LL`);
    /// unset: the variable's value, else the cost model's choice per call.
    pub proto: Option<String>,
}

impl PerfOptions {
    /// nccl-tests' defaults for `collective`: 32 MiB once, 5 warmup and 20 timed iterations,
    /// float sum, root 0, checked.
    pub fn new(collective: PerfCollective) -> Self {
        PerfOptions {
            collective,
            nthreads: 1,
            ngpus: 1,
            min_bytes: 32 << 20,
            max_bytes: 32 << 20,
            step_bytes: 1 << 20,
            step_factor: 1,
            iters: 20,
            agg_iters: 1,
            warmup_iters: 5,
            check: 1,
            dtypes: vec![DataType::F32],
            all_types: false,
            ops: vec![PerfOp::Sum],
            root: Some(0),
            average: Average::Mean,
            report_cputime: false,
            nchannels: None,
            timeout: None,
            proto: None,
        }
    }

    /// The sizes in bytes the benchmark steps through (nccl-tests' loop: multiply by the
    /// factor, or add the step, until above the largest), made as they are used: `-b 1 -e 1G
    /// -i 1` is a billion sizes, none of them stored.
    pub fn sizes(&self) -> impl Iterator<Item = u64> + '_ {
        let mut next = (self.min_bytes <= self.max_bytes).then_some(self.min_bytes);
        std::iter::from_fn(move || {
            let size = next?;
            let after = if self.step_factor > 1 {
                size.checked_mul(self.step_factor)
            } else {
                size.checked_add(self.step_bytes)
            };
            next = after.filter(|&n| n > size && n <= self.max_bytes);
            Some(size)
        })
    }
}

/// Parses nccl-tests' size syntax: a number, possibly fractional, and an optional `K`, `M`
/// or `G` (any case; powers of 1024), e.g. `64K`, `1.5M`.
pub fn parse_size(v: &str) -> Option<u64> {
    let t = v.trim();
    let (num, unit) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&t[..i], c),
        _ => (t, ' '),
    };
    let mult: f64 = match unit.to_ascii_uppercase() {
        ' ' => 1.0,
        'K' => 1024.0,
        'M' => 1024.0 * 1024.0,
        'G' => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let x: f64 = num.trim().parse().ok()?;
    let bytes = x * mult;
    // Below 2^63 and non-negative; the fraction is dropped as nccl-tests' cast does.
    (x.is_finite() && (0.0..9.2e18).contains(&bytes)).then_some(bytes as u64)
}

/// Parses a plain integer as `strtol(v, NULL, 0)` reads well-formed ones: decimal, or
/// hexadecimal with `0x`.
fn parse_int(v: &str) -> Option<i64> {
    let t = v.trim();
    let (neg, t) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let x = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => i64::from_str_radix(h, 16).ok()?,
        None if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => t.parse().ok()?,
        None => return None,
    };
    Some(if neg { -x } else { x })
}

/// The flags that take a value: (short, long).
const VALUED: [(char, &str); 19] = [
    ('t', "nthreads"),
    ('g', "ngpus"),
    ('b', "minbytes"),
    ('e', "maxbytes"),
    ('i', "stepbytes"),
    ('f', "stepfactor"),
    ('n', "iters"),
    ('m', "agg_iters"),
    ('w', "warmup_iters"),
    ('c', "check"),
    ('o', "op"),
    ('d', "datatype"),
    ('r', "root"),
    ('a', "average"),
    ('C', "report_cputime"),
    ('T', "timeout"),
    ('G', "cudagraph"),
    ('\0', "channels"),
    ('p', "proto"),
];

/// Parses `rsccl perf`'s arguments (the collective first, then flags in any order).
/// `Ok(None)` means `--help` was asked for; `Err` is a message for a command line that cannot
/// run.
pub fn parse(args: &[String]) -> Result<Option<PerfOptions>, String> {
    if args.iter().any(|a| a == "-h" || a == "--help") || args.first().map(String::as_str) == Some("help") {
        return Ok(None);
    }
    let Some((first, rest)) = args.split_first() else {
        return Err(
            "give the collective to benchmark: all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall, sendrecv, gather, scatter or hypercube"
                .into(),
        );
    };
    let coll = PerfCollective::from_name(first).ok_or_else(|| {
        format!(
            "unknown collective `{first}`: use all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall, sendrecv, gather, scatter or hypercube"
        )
    })?;
    let mut o = PerfOptions::new(coll);
    let mut channels_flag = None;
    let mut i = 0;
    while i < rest.len() {
        let a = &rest[i];
        // getopt_long's forms: `-b 8`, `-b8`, `--minbytes 8`, `--minbytes=8`.
        let (name, inline): (String, Option<String>) = if let Some(long) = a.strip_prefix("--") {
            match long.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (long.to_string(), None),
            }
        } else if let Some(short) = a.strip_prefix('-').filter(|s| !s.is_empty()) {
            let c = short.chars().next().expect("non-empty");
            let long = VALUED
                .iter()
                .find(|(s, _)| *s == c && c != '\0')
                .map(|(_, l)| l.to_string())
                .ok_or_else(|| format!("unknown option -{c}"))?;
            let tail = &short[c.len_utf8()..];
            (long, (!tail.is_empty()).then(|| tail.to_string()))
        } else {
            return Err(format!("unexpected argument `{a}`"));
        };
        if !VALUED.iter().any(|(_, l)| *l == name) {
            return Err(format!("unknown option --{name}"));
        }
        let value = match inline {
            Some(v) => v,
            None => {
                i += 1;
                rest.get(i).cloned().ok_or_else(|| format!("--{name} needs a value"))?
            }
        };
        i += 1;
        let int = |lo: i64, hi: i64| {
            parse_int(&value)
                .filter(|x| (lo..=hi).contains(x))
                .ok_or_else(|| format!("--{name} {value}: not an integer in {lo}..={hi}"))
        };
        let size = || {
            parse_size(&value).ok_or_else(|| format!("--{name} {value}: not a size (e.g. 8, 64K, 1M, 2G)"))
        };
        match name.as_str() {
            "nthreads" => {
                if int(1, i64::MAX)? != 1 {
                    return Err(format!(
                        "-t {value}: only one thread per process is supported; use -g for more ranks"
                    ));
                }
            }
            "ngpus" => o.ngpus = int(1, 1024)? as usize,
            "minbytes" => o.min_bytes = size()?,
            "maxbytes" => o.max_bytes = size()?,
            "stepbytes" => o.step_bytes = size()?,
            "stepfactor" => o.step_factor = int(1, 1 << 30)? as u64,
            "iters" => o.iters = int(1, i32::MAX as i64)? as usize,
            "agg_iters" => o.agg_iters = int(1, MAX_AGG_ITERS as i64)? as usize,
            "warmup_iters" => o.warmup_iters = int(0, i32::MAX as i64)? as usize,
            "check" => o.check = int(0, i32::MAX as i64)? as usize,
            "datatype" => {
                if value == "all" {
                    o.dtypes = TYPES.iter().map(|(_, t)| *t).collect();
                    o.all_types = true;
                } else {
                    let t = TYPES.iter().find(|(n, _)| *n == value).ok_or_else(|| {
                        let names: Vec<&str> = TYPES.iter().map(|(n, _)| *n).collect();
                        format!("-d {value}: not a data type; use one of {} or all", names.join(" "))
                    })?;
                    o.dtypes = vec![t.1];
                    o.all_types = false;
                }
            }
            "op" => {
                o.ops = if value == "all" {
                    PerfOp::ALL.to_vec()
                } else {
                    vec![PerfOp::from_name(&value).ok_or_else(|| {
                        format!("-o {value}: not a reduction; use sum prod max min avg mulsum (or premulsum) or all")
                    })?]
                };
            }
            "root" => {
                o.root = match value.as_str() {
                    "all" => None,
                    _ => match int(-1, 1 << 20)? {
                        -1 => None,
                        r => Some(r as usize),
                    },
                }
            }
            "average" => {
                o.average = match int(0, 3)? {
                    0 => Average::Rank0,
                    1 => Average::Mean,
                    2 => Average::Min,
                    _ => Average::Max,
                }
            }
            "report_cputime" => o.report_cputime = int(0, 1)? == 1,
            "timeout" => {
                let s = int(0, 86_400)?;
                o.timeout = (s > 0).then(|| Duration::from_secs(s as u64));
            }
            "cudagraph" => {
                if int(0, i64::MAX)? != 0 {
                    return Err(format!("-G {value}: CUDA graphs are not supported; use -G 0"));
                }
            }
            "channels" => channels_flag = Some(int(1, MAX_CHANNELS as i64)? as usize),
            "proto" => {
                crate::tuning::Enabled::parse(None, Some(&value)).map_err(|e| format!("-p {value}: {e}"))?;
                o.proto = Some(value);
            }
            _ => unreachable!("every name of VALUED is handled"),
        }
    }
    if o.min_bytes > o.max_bytes {
        return Err(format!(
            "invalid sizes for 'minbytes' and 'maxbytes': {} > {}",
            o.min_bytes, o.max_bytes
        ));
    }
    if o.step_factor <= 1 && o.step_bytes == 0 && o.min_bytes < o.max_bytes {
        return Err("-i 0 with -f 1 never reaches maxbytes: give a step or a factor".into());
    }
    if o.step_factor > 1 && o.min_bytes == 0 && o.max_bytes > 0 {
        return Err("-b 0 with -f > 1 never grows: start at 1 byte or more".into());
    }
    o.nchannels = match channels_flag {
        Some(c) => Some(c),
        None => match std::env::var("RSCCL_NCHANNELS") {
            Ok(v) if !v.trim().is_empty() => {
                Some(parse_int(&v).filter(|c| (1..=MAX_CHANNELS as i64).contains(c)).ok_or_else(|| {
                    format!("RSCCL_NCHANNELS={v}: not a channel count in 1..={MAX_CHANNELS}")
                })? as usize)
            }
            _ => None,
        },
    };
    Ok(Some(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Option<PerfOptions>, String> {
        parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    fn ok(args: &[&str]) -> PerfOptions {
        p(args).unwrap().unwrap()
    }

    #[test]
    fn sizes_parse_as_nccl_tests() {
        assert_eq!(parse_size("8"), Some(8));
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("64k"), Some(65536));
        assert_eq!(parse_size("1.5M"), Some(1572864));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        for bad in ["", "K", "1T", "-1", "x", "1KB"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }

    #[test]
    fn sizes_are_made_as_they_are_used() {
        // A billion sizes: the first come at once, none stored (a list would take 8 GiB).
        let o = ok(&["all_reduce", "-b", "1", "-e", "1G", "-i", "1"]);
        assert_eq!(o.sizes().take(3).collect::<Vec<_>>(), [1, 2, 3]);
        let o = ok(&["all_reduce", "-b", "1", "-e", "1M", "-i", "1"]);
        assert_eq!((o.sizes().count(), o.sizes().last()), (1 << 20, Some(1 << 20)));
        // Growth that would overflow ends the sizes instead of wrapping.
        let o = PerfOptions { min_bytes: 1 << 62, max_bytes: u64::MAX, step_factor: 4, ..o };
        assert_eq!(o.sizes().collect::<Vec<_>>(), [1 << 62]);
    }

    #[test]
    fn flag_forms_and_defaults() {
        let mut d = ok(&["all_reduce"]);
        d.nchannels = None; // RSCCL_NCHANNELS may be set where the tests run
        assert_eq!(d, PerfOptions::new(PerfCollective::AllReduce));
        for args in [
            &["all_reduce", "-b", "8", "-e", "64K", "-f", "4"][..],
            &["all_reduce", "-b8", "-e64K", "-f4"],
            &["all_reduce", "--minbytes", "8", "--maxbytes=64K", "--stepfactor", "4"],
        ] {
            let o = ok(args);
            assert_eq!((o.min_bytes, o.max_bytes, o.step_factor), (8, 65536, 4), "{args:?}");
            assert_eq!(o.sizes().collect::<Vec<_>>(), [8, 32, 128, 512, 2048, 8192, 32768]);
        }
        let o = ok(&[
            "broadcast_perf",
            "-r",
            "all",
            "-d",
            "all",
            "-o",
            "all",
            "-i",
            "1K",
            "-b",
            "1K",
            "-e",
            "3K",
        ]);
        assert_eq!((o.root, o.dtypes.len(), o.ops.len()), (None, 12, 6));
        assert_eq!(o.sizes().collect::<Vec<_>>(), [1024, 2048, 3072]);
        assert_eq!(ok(&["reduce", "-r", "-1"]).root, None);
        assert_eq!(ok(&["reduce", "-o", "premulsum"]).ops, [PerfOp::MulSum]);
        assert_eq!(ok(&["reduce", "-d", "bfloat16"]).dtypes, [DataType::BF16]);
        assert_eq!(ok(&["reduce", "--channels", "3"]).nchannels, Some(3));
        assert_eq!(p(&["--help"]), Ok(None));
        assert_eq!(p(&["all_gather", "-h"]), Ok(None));
    }

    #[test]
    fn bad_command_lines_are_refused() {
        for args in [
            &[][..],
            &["allreduce"],
            &["all_reduce", "-x", "1"],
            &["all_reduce", "--bogus", "1"],
            &["all_reduce", "-b"],
            &["all_reduce", "-b", "1T"],
            &["all_reduce", "-b", "2K", "-e", "1K"],
            &["all_reduce", "-d", "float32"],
            &["all_reduce", "-o", "xor"],
            &["all_reduce", "-t", "2"],
            &["all_reduce", "-g", "0"],
            &["all_reduce", "-n", "0"],
            &["all_reduce", "-c", "x"],
            &["all_reduce", "-G", "1"],
            &["all_reduce", "-b", "0", "-e", "1K", "-f", "2"],
            &["all_reduce", "extra"],
        ] {
            assert!(p(args).is_err(), "{args:?} accepted");
        }
    }
}

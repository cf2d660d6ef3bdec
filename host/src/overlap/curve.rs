//! Bus-bandwidth curves for the overlap tuner: how long a collective on `bytes` takes, read
//! from a `rsccl perf` report (nccl-tests' format) or a two-column file, or modelled from a
//! named machine's assumed figures ([`GpuPreset`]).
//!
//! Times come from bus bandwidth as nccl-tests defines it (`busbw = algbw × factor`, `algbw =
//! bytes / time`, `bytes` the full buffer of the size column), so `time = bytes × factor /
//! busbw` with the factor of [`Collective::bus_factor`].
use std::fmt;
use std::io::Read;
use std::path::Path;

/// The largest bandwidth file read; a report of 36 sizes is about 4 KiB, so anything near
/// this is not a bandwidth table.
pub const MAX_CURVE_FILE_BYTES: u64 = 1 << 20;

/// The most points a curve holds: nccl-tests sweeps are tens of sizes, and interpolation is a
/// binary search, so this bounds memory, not time.
pub const MAX_CURVE_POINTS: usize = 4096;

/// The collective that consumes a GEMM's output, as the tuner and `--coll` name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// All-reduce of the whole output (tensor-parallel row-parallel linear layers).
    AllReduce,
    /// Reduce-scatter of the output: each rank keeps `1/R` of the reduced rows.
    ReduceScatter,
    /// All-to-all of the output (expert-parallel token dispatch).
    AllToAll,
}

impl Collective {
    /// Every collective, in the order `--help` lists them.
    pub const ALL: [Collective; 3] = [Collective::AllReduce, Collective::ReduceScatter, Collective::AllToAll];

    /// The command-line and plan-file name: `all_reduce`, `reduce_scatter`, `all_to_all`.
    ///
    /// ```
    /// use rsccl::overlap::curve::Collective;
    /// assert_eq!(Collective::ReduceScatter.name(), "reduce_scatter");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllToAll => "all_to_all",
        }
    }

    /// Parses a [`name`](Self::name).
    ///
    /// ```
    /// use rsccl::overlap::curve::Collective;
    /// assert_eq!(Collective::from_name("all_to_all"), Some(Collective::AllToAll));
    /// assert_eq!(Collective::from_name("alltoall"), None);
    /// ```
    pub fn from_name(s: &str) -> Option<Collective> {
        Self::ALL.into_iter().find(|c| c.name() == s)
    }

    /// nccl-tests' bus-bandwidth factor on `ranks` ranks: `2(R−1)/R` for all-reduce (each
    /// byte crosses a link twice, reduce then broadcast), `(R−1)/R` for reduce-scatter and
    /// all-to-all (all-gather has the same); 0 for one rank, which moves nothing.
    ///
    /// ```
    /// use rsccl::overlap::curve::Collective;
    /// assert_eq!(Collective::AllReduce.bus_factor(8), 1.75);
    /// assert_eq!(Collective::ReduceScatter.bus_factor(4), 0.75);
    /// ```
    pub fn bus_factor(self, ranks: u32) -> f64 {
        if ranks <= 1 {
            return 0.0;
        }
        let r = f64::from(ranks);
        match self {
            Collective::AllReduce => 2.0 * (r - 1.0) / r,
            Collective::ReduceScatter | Collective::AllToAll => (r - 1.0) / r,
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One measured size: the full buffer in bytes and its bus bandwidth in GB/s (10^9 B/s).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    /// The size column: the full buffer of the collective, in bytes.
    pub bytes: u64,
    /// Bus bandwidth at that size, GB/s.
    pub busbw_gbps: f64,
}

/// A bus-bandwidth curve of one collective on one rank count: sizes in increasing order with
/// their busbw, interpolated linearly in (log bytes, log busbw).
///
/// [`time_us`](Self::time_us) turns it into a collective's time. Outside the measured sizes
/// it clamps: above the largest, the largest size's busbw (bandwidth-bound); below the
/// smallest, the smallest size's time (latency-bound: a smaller message is taken to be no
/// faster, rather than extrapolating toward zero time).
///
/// ```
/// use rsccl::overlap::curve::{BandwidthCurve, Collective, Point};
///
/// let c = BandwidthCurve::from_points(
///     "example",
///     vec![Point { bytes: 1 << 20, busbw_gbps: 50.0 }, Point { bytes: 1 << 30, busbw_gbps: 200.0 }],
/// )?;
/// // 1 GiB all-reduce on 8 ranks: 2^30 × 1.75 bytes at 200 GB/s.
/// let t = c.time_us(Collective::AllReduce, 1 << 30, 8);
/// assert!((t - 1.75 * 1073741824.0 / 200e3).abs() < 1e-6);
/// # Ok::<(), rsccl::overlap::curve::CurveError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct BandwidthCurve {
    source: String,
    points: Vec<Point>,
    ranks: Option<u32>,
}

impl BandwidthCurve {
    /// A curve of `points` (strictly increasing sizes, positive finite busbw, 1 to
    /// [`MAX_CURVE_POINTS`]); `source` names where they came from in messages.
    pub fn from_points(source: &str, points: Vec<Point>) -> Result<BandwidthCurve, CurveError> {
        let bad = |reason: String| CurveError::Invalid { source: source.to_string(), reason };
        if points.is_empty() {
            return Err(bad("no points".into()));
        }
        if points.len() > MAX_CURVE_POINTS {
            return Err(bad(format!("{} points, more than the {MAX_CURVE_POINTS} allowed", points.len())));
        }
        for (i, p) in points.iter().enumerate() {
            if p.bytes == 0 || !(p.busbw_gbps.is_finite() && p.busbw_gbps > 0.0) {
                return Err(bad(format!(
                    "point {i}: {} bytes at {} GB/s (sizes and bandwidths must be positive)",
                    p.bytes, p.busbw_gbps
                )));
            }
            if i > 0 && p.bytes <= points[i - 1].bytes {
                return Err(bad(format!("point {i}: size {} is not above the previous one", p.bytes)));
            }
        }
        Ok(BandwidthCurve { source: source.to_string(), points, ranks: None })
    }

    /// The alpha-beta model of a machine's collective: `time = latency + bytes × factor /
    /// peak` (factor of `coll` on `ranks`), sampled at 4 sizes per octave from 1 KiB to 64 GiB,
    /// so busbw rises from latency-bound toward `peak` as nccl-tests curves do.
    ///
    /// ```
    /// use rsccl::overlap::curve::{BandwidthCurve, Collective, GpuPreset};
    ///
    /// let c = BandwidthCurve::model(&GpuPreset::A100, Collective::AllReduce, 8);
    /// let bytes = 256u64 << 20;
    /// let model = GpuPreset::A100.latency_us + bytes as f64 * 1.75 / (GpuPreset::A100.peak_busbw_gbps * 1e3);
    /// assert!((c.time_us(Collective::AllReduce, bytes, 8) - model).abs() / model < 1e-3);
    /// ```
    pub fn model(gpu: &GpuPreset, coll: Collective, ranks: u32) -> BandwidthCurve {
        // Bytes on the wire per rank: one rank moves nothing, and its curve is flat at peak.
        let factor = coll.bus_factor(ranks).max(f64::MIN_POSITIVE);
        let points = (0..=MODEL_OCTAVES * MODEL_STEPS_PER_OCTAVE)
            .map(|i| {
                let bytes =
                    (MODEL_MIN_BYTES as f64 * 2f64.powf(i as f64 / MODEL_STEPS_PER_OCTAVE as f64)).round();
                let time_us = gpu.latency_us + bytes * factor / (gpu.peak_busbw_gbps * 1e3);
                Point { bytes: bytes as u64, busbw_gbps: bytes * factor / (time_us * 1e3) }
            })
            .collect();
        BandwidthCurve {
            source: format!(
                "{} model ({} us + bytes on the wire at {} GB/s; assumed, not measured)",
                gpu.name, gpu.latency_us, gpu.peak_busbw_gbps
            ),
            points,
            ranks: Some(ranks),
        }
    }

    /// Reads a curve from `path`: a `rsccl perf` / nccl-tests report (size and out-of-place
    /// busbw of each row) or a two-column `bytes busbw_GBps` file; see [`parse`](Self::parse).
    pub fn load(path: &Path) -> Result<BandwidthCurve, CurveError> {
        let file = path.display().to_string();
        let io = |e: std::io::Error| CurveError::Io { file: file.clone(), message: e.to_string() };
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .map_err(io)?
            .take(MAX_CURVE_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        if bytes.len() as u64 > MAX_CURVE_FILE_BYTES {
            return Err(CurveError::TooLarge { file, limit: MAX_CURVE_FILE_BYTES });
        }
        let text = String::from_utf8(bytes)
            .map_err(|e| CurveError::Io { file: file.clone(), message: format!("not UTF-8 text: {e}") })?;
        Self::parse(&file, &text)
    }

    /// Parses a curve from `text` (`file` names it in errors). Lines starting with `#` and
    /// blank lines are skipped, except nccl-tests' `#  Rank N ...` device lines, which give
    /// [`ranks`](Self::ranks); a launcher's `[rank N] ` prefix is dropped. Each other line is
    /// either a report row — 13 columns: size, count, type, redop, root, then time, algbw,
    /// busbw and #wrong out of place and in place — or `bytes busbw_GBps`; one file uses one
    /// form. Sizes must increase (one table per file).
    ///
    /// ```
    /// use rsccl::overlap::curve::BandwidthCurve;
    ///
    /// let c = BandwidthCurve::parse("bw.txt", "# bytes busbw\n1048576 40.5\n1073741824 220\n")?;
    /// assert_eq!(c.points().len(), 2);
    /// let e = BandwidthCurve::parse("bw.txt", "1048576 40.5\n1024 x\n").unwrap_err();
    /// assert!(e.to_string().starts_with("bw.txt:2:"));
    /// # Ok::<(), rsccl::overlap::curve::CurveError>(())
    /// ```
    pub fn parse(file: &str, text: &str) -> Result<BandwidthCurve, CurveError> {
        let mut points: Vec<Point> = Vec::new();
        let mut form: Option<Form> = None;
        let mut max_rank: Option<u32> = None;
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let bad = |reason: String| CurveError::Malformed { file: file.to_string(), line, reason };
            let l = strip_launcher_prefix(raw).trim();
            if let Some(comment) = l.strip_prefix('#') {
                if let Some(rank) = rank_line(comment) {
                    max_rank = Some(max_rank.map_or(rank, |m| m.max(rank)));
                }
                continue;
            }
            if l.is_empty() {
                continue;
            }
            let cols: Vec<&str> = l.split_whitespace().collect();
            let this = match cols.len() {
                2 => Form::TwoColumn,
                REPORT_COLUMNS => Form::Report,
                n => {
                    return Err(bad(format!(
                        "{n} columns: expected `bytes busbw_GBps` (2) or a rsccl perf / nccl-tests row ({REPORT_COLUMNS})"
                    )))
                }
            };
            match form {
                Some(f) if f != this => {
                    return Err(bad(format!("a {} line in a file of {} lines", this.name(), f.name())))
                }
                _ => form = Some(this),
            }
            let (bytes, busbw) = match this {
                Form::TwoColumn => (cols[0], cols[1]),
                Form::Report => {
                    // The count column and the out-of-place time check that this is a row, not
                    // some other 13-word line.
                    cols[1]
                        .parse::<u64>()
                        .map_err(|_| bad(format!("count `{}` is not an integer", cols[1])))?;
                    number(cols[5]).ok_or_else(|| bad(format!("time `{}` is not a number", cols[5])))?;
                    (cols[0], cols[7])
                }
            };
            let bytes: u64 = bytes.parse().map_err(|_| bad(format!("size `{bytes}` is not a byte count")))?;
            let busbw_gbps = number(busbw).ok_or_else(|| bad(format!("busbw `{busbw}` is not a number")))?;
            if bytes == 0 {
                return Err(bad("size 0: a curve needs positive sizes".into()));
            }
            if busbw_gbps <= 0.0 {
                return Err(bad(format!(
                    "busbw {busbw} GB/s: a curve needs positive bandwidths (sizes whose busbw prints as 0.00 cannot be used)"
                )));
            }
            if let Some(prev) = points.last() {
                if bytes <= prev.bytes {
                    return Err(bad(format!(
                        "size {bytes} is not above the previous row's {} (one table per file: one -d and one -o)",
                        prev.bytes
                    )));
                }
            }
            if points.len() == MAX_CURVE_POINTS {
                return Err(bad(format!("more than {MAX_CURVE_POINTS} points")));
            }
            points.push(Point { bytes, busbw_gbps });
        }
        if points.is_empty() {
            return Err(CurveError::Invalid { source: file.to_string(), reason: "no data rows".into() });
        }
        Ok(BandwidthCurve { source: file.to_string(), points, ranks: max_rank.map(|r| r + 1) })
    }

    /// Where the points came from (a file name or a model's description).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The points, sizes increasing.
    pub fn points(&self) -> &[Point] {
        &self.points
    }

    /// The rank count the curve was measured or modelled on, when known: a report's
    /// `#  Rank N` device lines (highest N plus one), or the model's `ranks`.
    pub fn ranks(&self) -> Option<u32> {
        self.ranks
    }

    /// Bus bandwidth at `bytes` in GB/s: log-log interpolation between points, the end
    /// points' values outside them.
    pub fn busbw_gbps(&self, bytes: u64) -> f64 {
        let p = &self.points;
        let i = p.partition_point(|q| q.bytes <= bytes);
        if i == 0 {
            return p[0].busbw_gbps;
        }
        if i == p.len() {
            return p[i - 1].busbw_gbps;
        }
        let (a, b) = (p[i - 1], p[i]);
        if a.bytes == bytes {
            return a.busbw_gbps;
        }
        let t =
            ((bytes as f64).ln() - (a.bytes as f64).ln()) / ((b.bytes as f64).ln() - (a.bytes as f64).ln());
        (a.busbw_gbps.ln() + t * (b.busbw_gbps.ln() - a.busbw_gbps.ln())).exp()
    }

    /// The time in µs of `coll` on a full buffer of `bytes` across `ranks` ranks:
    /// `bytes × factor / busbw`, with nccl-tests' factor ([`Collective::bus_factor`]:
    /// all-reduce `2(R−1)/R`, reduce-scatter, all-gather and all-to-all `(R−1)/R`) and busbw
    /// from [`busbw_gbps`](Self::busbw_gbps); below the smallest point, the smallest point's
    /// time. Zero bytes or one rank take no time.
    pub fn time_us(&self, coll: Collective, bytes: u64, ranks: u32) -> f64 {
        let factor = coll.bus_factor(ranks);
        if bytes == 0 || factor == 0.0 {
            return 0.0;
        }
        let at = bytes.max(self.points[0].bytes);
        // GB/s = 10^3 bytes per µs.
        at as f64 * factor / (self.busbw_gbps(at) * 1e3)
    }
}

/// The figures of a GPU model the tuner assumes when nothing is measured: SM count, GEMM rate
/// and an alpha-beta model of its collectives. **Assumed, not measured** — public spec-sheet
/// orders of magnitude, to be replaced by a measured curve (`--bandwidth`) and GEMM time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuPreset {
    /// The preset's name (`a100`, `h100`).
    pub name: &'static str,
    /// Streaming multiprocessors: one GEMM tile per SM per wave.
    pub sms: u32,
    /// Achievable fp16/bf16 tensor-core GEMM rate, TFLOP/s (10^12 FLOP/s).
    pub gemm_tflops: f64,
    /// The collective's fixed cost per call (alpha), µs.
    pub latency_us: f64,
    /// Large-message bus bandwidth (beta's inverse), GB/s; taken as the same for every rank
    /// count and collective, as an NVSwitch box gives each GPU its full NVLink bandwidth.
    pub peak_busbw_gbps: f64,
}

/// A100-SXM's SMs (GA100 as shipped: 108 of 128 enabled).
const A100_SMS: u32 = 108;
/// About 80% of A100's 312 TFLOP/s dense fp16 peak: what large CUTLASS GEMMs reach.
const A100_GEMM_TFLOPS: f64 = 250.0;
/// Order of nccl-tests' small-message all-reduce time on 8 NVLink3 A100s.
const A100_LATENCY_US: f64 = 20.0;
/// nccl-tests' large all-reduce busbw on 8 A100-SXM over NVLink3/NVSwitch (~230 GB/s).
const A100_PEAK_BUSBW_GBPS: f64 = 230.0;
/// H100-SXM's SMs (GH100 as shipped: 132 of 144 enabled).
const H100_SMS: u32 = 132;
/// About 60% of H100-SXM's ~990 TFLOP/s dense fp16 peak: what large GEMMs reach in practice.
const H100_GEMM_TFLOPS: f64 = 600.0;
/// Order of nccl-tests' small-message all-reduce time on 8 NVLink4 H100s.
const H100_LATENCY_US: f64 = 15.0;
/// nccl-tests' large all-reduce busbw on 8 H100-SXM over NVLink4 without NVLS (360–400 GB/s).
const H100_PEAK_BUSBW_GBPS: f64 = 370.0;

/// The model's smallest sampled size: below nccl-tests' usual sweeps, latency-bound anyway.
const MODEL_MIN_BYTES: u64 = 1 << 10;
/// Octaves sampled from [`MODEL_MIN_BYTES`]: up to 64 GiB, past any GEMM output here.
const MODEL_OCTAVES: u32 = 26;
/// Samples per octave: FlashOverlap's sweep uses 4 (`2^(20+0.25 i)` elements).
const MODEL_STEPS_PER_OCTAVE: u32 = 4;

impl GpuPreset {
    /// A100-SXM-like figures (NVLink3): assumed, not measured.
    pub const A100: GpuPreset = GpuPreset {
        name: "a100",
        sms: A100_SMS,
        gemm_tflops: A100_GEMM_TFLOPS,
        latency_us: A100_LATENCY_US,
        peak_busbw_gbps: A100_PEAK_BUSBW_GBPS,
    };

    /// H100-SXM-like figures (NVLink4): assumed, not measured.
    pub const H100: GpuPreset = GpuPreset {
        name: "h100",
        sms: H100_SMS,
        gemm_tflops: H100_GEMM_TFLOPS,
        latency_us: H100_LATENCY_US,
        peak_busbw_gbps: H100_PEAK_BUSBW_GBPS,
    };

    /// Every preset, in the order `--help` lists them.
    pub const ALL: [GpuPreset; 2] = [GpuPreset::A100, GpuPreset::H100];

    /// The preset called `name`.
    ///
    /// ```
    /// use rsccl::overlap::curve::GpuPreset;
    /// assert_eq!(GpuPreset::by_name("h100").map(|g| g.sms), Some(132));
    /// assert!(GpuPreset::by_name("v100").is_none());
    /// ```
    pub fn by_name(name: &str) -> Option<GpuPreset> {
        Self::ALL.into_iter().find(|g| g.name == name)
    }
}

/// What is wrong with a bandwidth file or a set of points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CurveError {
    /// The file could not be read.
    Io {
        /// The file.
        file: String,
        /// The system's message.
        message: String,
    },
    /// The file is over [`MAX_CURVE_FILE_BYTES`].
    TooLarge {
        /// The file.
        file: String,
        /// The limit in bytes.
        limit: u64,
    },
    /// A line is not a data row of either form.
    Malformed {
        /// The file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The points as a whole cannot make a curve (none, too many, not increasing).
    Invalid {
        /// The file or the name given to [`BandwidthCurve::from_points`].
        source: String,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for CurveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CurveError::Io { file, message } => {
                write!(f, "{file}: cannot read the bandwidth file: {message}")
            }
            CurveError::TooLarge { file, limit } => {
                write!(f, "{file}: over {limit} bytes, too large for a bandwidth table")
            }
            CurveError::Malformed { file, line, reason } => write!(f, "{file}:{line}: {reason}"),
            CurveError::Invalid { source, reason } => write!(f, "{source}: not a bandwidth curve: {reason}"),
        }
    }
}

impl std::error::Error for CurveError {}

/// Columns of a `rsccl perf` / nccl-tests row: 5 of parameters, 4 out of place, 4 in place.
const REPORT_COLUMNS: usize = 13;

/// The two line forms a bandwidth file may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    TwoColumn,
    Report,
}

impl Form {
    fn name(self) -> &'static str {
        match self {
            Form::TwoColumn => "two-column",
            Form::Report => "report-row",
        }
    }
}

/// A finite number (Rust's parser also takes `inf` and `nan`, which no table holds).
fn number(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().filter(|x| x.is_finite())
}

/// `rsccl run` prefixes each line of rank N with `[rank N] `; a saved report keeps it.
fn strip_launcher_prefix(line: &str) -> &str {
    let t = line.trim_start();
    match t.strip_prefix("[rank ").and_then(|r| r.split_once("] ")) {
        Some((n, rest)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => rest,
        _ => line,
    }
}

/// The rank of an nccl-tests device line (`#  Rank  3 Group  0 Pid ...`, given without `#`).
fn rank_line(comment: &str) -> Option<u32> {
    let mut w = comment.split_whitespace();
    (w.next()? == "Rank").then_some(())?;
    let rank = w.next()?.parse().ok()?;
    (w.next()? == "Group").then_some(rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two rows of a 4-rank `rsccl perf all_reduce` report, as `rsccl run` prints it.
    const REPORT: &str = "\
[rank 0] # nThread 1 nGpus 1 minBytes 1048576 maxBytes 4194304 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
[rank 0] #
[rank 0] # Using devices
[rank 0] #  Rank  0 Group  0 Pid  25082 on         vm device  0 [cpu] CPU emulator
[rank 0] #  Rank  1 Group  0 Pid  25084 on         vm device  1 [cpu] CPU emulator
[rank 0] #  Rank  2 Group  0 Pid  25085 on         vm device  2 [cpu] CPU emulator
[rank 0] #  Rank  3 Group  0 Pid  25088 on         vm device  3 [cpu] CPU emulator
[rank 0] #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
     1048576        262144     float     sum      -1    101.2   10.36   18.13      0    100.9   10.39   18.18      0
     4194304       1048576     float     sum      -1    361.3   11.61   20.32    N/A    360.8   11.62   20.34    N/A
# Avg bus bandwidth    : 19.2
";

    fn two_point() -> BandwidthCurve {
        BandwidthCurve::from_points(
            "t",
            vec![Point { bytes: 1 << 20, busbw_gbps: 10.0 }, Point { bytes: 1 << 24, busbw_gbps: 160.0 }],
        )
        .unwrap()
    }

    #[test]
    fn report_rows_give_size_and_out_of_place_busbw_and_rank_lines_the_rank_count() {
        let c = BandwidthCurve::parse("r.txt", REPORT).unwrap();
        assert_eq!(
            c.points(),
            [Point { bytes: 1048576, busbw_gbps: 18.13 }, Point { bytes: 4194304, busbw_gbps: 20.32 }]
        );
        assert_eq!(c.ranks(), Some(4));
        assert_eq!(c.source(), "r.txt");
    }

    #[test]
    fn interpolation_is_linear_in_log_bytes_and_log_busbw_and_clamps_at_the_ends() {
        let c = two_point();
        // 2^22 is halfway in log bytes between 2^20 and 2^24: the geometric mean of 10 and 160.
        assert!((c.busbw_gbps(1 << 22) - 40.0).abs() < 1e-9);
        assert_eq!(c.busbw_gbps(1 << 20), 10.0);
        assert_eq!(c.busbw_gbps(1 << 30), 160.0);
        // Above: busbw held, so time grows with bytes. Below: the smallest size's time.
        let big = c.time_us(Collective::ReduceScatter, 1 << 30, 2);
        assert!((big - (1u64 << 30) as f64 * 0.5 / 160e3).abs() < 1e-9);
        let floor = c.time_us(Collective::AllReduce, 1 << 20, 4);
        assert_eq!(c.time_us(Collective::AllReduce, 1000, 4), floor);
        assert!((floor - (1u64 << 20) as f64 * 1.5 / 10e3).abs() < 1e-9);
        assert_eq!(c.time_us(Collective::AllReduce, 0, 4), 0.0);
        assert_eq!(c.time_us(Collective::AllReduce, 1 << 22, 1), 0.0);
    }

    #[test]
    fn collective_time_uses_nccl_tests_bus_factors() {
        let c = two_point();
        let bytes = 1u64 << 24;
        let base = bytes as f64 / 160e3;
        assert!((c.time_us(Collective::AllReduce, bytes, 8) - base * 14.0 / 8.0).abs() < 1e-9);
        assert!((c.time_us(Collective::ReduceScatter, bytes, 8) - base * 7.0 / 8.0).abs() < 1e-9);
        assert!((c.time_us(Collective::AllToAll, bytes, 8) - base * 7.0 / 8.0).abs() < 1e-9);
    }

    #[test]
    fn parse_errors_name_the_file_and_line() {
        let cases: [(&str, &str); 8] = [
            ("1024 1.0\n2048\n", "f:2: 1 columns"),
            ("# c\n\n1024 x\n", "f:3: busbw `x` is not a number"),
            ("1k 1.0\n", "f:1: size `1k` is not a byte count"),
            ("1024 1.0\n1024 2.0\n", "f:2: size 1024 is not above"),
            ("1024 0.00\n", "f:1: busbw 0.00 GB/s"),
            ("1024 inf\n", "f:1: busbw `inf`"),
            (
                "1024 1.0\n  2048  512  float  sum  -1  3.0  0.1  0.2  0  3.0  0.1  0.2  0\n",
                "f:2: a report-row line",
            ),
            ("8 2 float sum -1 40.5 0.00 0.00 0 39.7 0.00 0.00 0\n", "f:1: busbw 0.00"),
        ];
        for (text, want) in cases {
            let e = BandwidthCurve::parse("f", text).unwrap_err().to_string();
            assert!(e.starts_with(want), "{text:?}: {e}");
        }
        let e = BandwidthCurve::parse("f", "# only comments\n").unwrap_err();
        assert_eq!(e.to_string(), "f: not a bandwidth curve: no data rows");
        let row = "1 2 float sum -1 notatime 0.1 0.2 0 3.0 0.1 0.2 0\n";
        assert!(BandwidthCurve::parse("f", row).unwrap_err().to_string().starts_with("f:1: time `notatime`"));
    }

    #[test]
    fn point_count_and_file_size_are_bounded() {
        let text: String = (1..=MAX_CURVE_POINTS as u64 + 1).map(|i| format!("{i} 1.0\n")).collect();
        let e = BandwidthCurve::parse("f", &text).unwrap_err().to_string();
        assert_eq!(e, format!("f:{}: more than {MAX_CURVE_POINTS} points", MAX_CURVE_POINTS + 1));
        let path = std::env::temp_dir().join(format!("rsccl-curve-big-{}.txt", std::process::id()));
        std::fs::write(&path, vec![b'#'; MAX_CURVE_FILE_BYTES as usize + 1]).unwrap();
        let e = BandwidthCurve::load(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(e, CurveError::TooLarge { .. }), "{e}");
        let missing = BandwidthCurve::load(Path::new("/nonexistent/bw.txt")).unwrap_err().to_string();
        assert!(missing.starts_with("/nonexistent/bw.txt: cannot read"), "{missing}");
    }

    #[test]
    fn model_rises_toward_its_peak_and_matches_alpha_beta_time() {
        let g = GpuPreset::H100;
        let c = BandwidthCurve::model(&g, Collective::AllReduce, 8);
        assert_eq!(c.ranks(), Some(8));
        let bw: Vec<f64> = c.points().iter().map(|p| p.busbw_gbps).collect();
        assert!(bw.windows(2).all(|w| w[0] < w[1]));
        assert!(bw[bw.len() - 1] > 0.99 * g.peak_busbw_gbps && bw[bw.len() - 1] < g.peak_busbw_gbps);
        // Between samples the interpolation stays within 0.1% of the model.
        for bytes in [3_000_000u64, 123_456_789, 1 << 29] {
            let model = g.latency_us + bytes as f64 * 1.75 / (g.peak_busbw_gbps * 1e3);
            let t = c.time_us(Collective::AllReduce, bytes, 8);
            assert!((t - model).abs() / model < 1e-3, "{bytes}: {t} vs {model}");
        }
    }

    #[test]
    fn from_points_refuses_unordered_or_nonpositive_points() {
        let p = |bytes, busbw_gbps| Point { bytes, busbw_gbps };
        assert!(BandwidthCurve::from_points("x", vec![]).is_err());
        assert!(BandwidthCurve::from_points("x", vec![p(2, 1.0), p(1, 1.0)]).is_err());
        assert!(BandwidthCurve::from_points("x", vec![p(1, -1.0)]).is_err());
        assert!(BandwidthCurve::from_points("x", vec![p(0, 1.0)]).is_err());
        assert!(BandwidthCurve::from_points("x", vec![p(1, 1.0)]).is_ok());
    }
}

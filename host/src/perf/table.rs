//! The text of an nccl-tests report, built from the same printf formats as nccl-tests'
//! `common.cu` so that each line matches it byte for byte: the parameter header, the device
//! lines, the two column header lines (plus the out-of-place / in-place line above them), one
//! row per size, and the footer.

/// The parameters the first line reports.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    /// Threads per process.
    pub nthreads: usize,
    /// Ranks per thread.
    pub ngpus: usize,
    /// First size in bytes.
    pub min_bytes: u64,
    /// Last size in bytes.
    pub max_bytes: u64,
    /// The size step: a factor when `factor`, else bytes.
    pub step: u64,
    /// Whether `step` multiplies.
    pub factor: bool,
    /// Warmup iterations.
    pub warmup_iters: usize,
    /// Timed iterations.
    pub iters: usize,
    /// Collectives per timed iteration.
    pub agg_iters: usize,
    /// Checked runs per size (`validation`).
    pub check: usize,
}

/// The parameter line, then `#` and `# Using devices`.
pub fn header(h: &Header) -> String {
    format!(
        "# nThread {} nGpus {} minBytes {} maxBytes {} step: {}({}) warmup iters: {} iters: {} agg iters: {} validation: {} graph: {}\n#\n# Using devices\n",
        h.nthreads,
        h.ngpus,
        h.min_bytes,
        h.max_bytes,
        h.step,
        if h.factor { "factor" } else { "bytes" },
        h.warmup_iters,
        h.iters,
        h.agg_iters,
        h.check,
        0
    )
}

/// One rank's device line: `#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s`, where
/// nccl-tests prints the PCI bus id in brackets and this prints `bus` (e.g. `cpu`).
pub fn rank_line(
    rank: usize,
    group: usize,
    pid: u32,
    host: &str,
    device: usize,
    bus: &str,
    name: &str,
) -> String {
    format!("#  Rank {rank:2} Group {group:2} Pid {pid:6} on {host:>10} device {device:2} [{bus}] {name}\n")
}

/// The host name as nccl-tests prints it: up to the first dot.
pub fn short_host(host: &str) -> &str {
    host.split('.').next().unwrap_or(host)
}

/// `#`, the out-of-place / in-place line and the two column header lines; `cputime` labels
/// the time columns as nccl-tests' `-C 1` does.
pub fn columns(cputime: bool) -> String {
    let t = if cputime { "cputime" } else { "time" };
    let mut s = String::from("#\n");
    s += &format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          \n",
        "", "", "", "", ""
    );
    s += &format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:>7}  {:>6}  {:>6} {:>6}\n",
        "size",
        "count",
        "type",
        "redop",
        "root",
        t,
        "algbw",
        "busbw",
        "#wrong",
        t,
        "algbw",
        "busbw",
        "#wrong"
    );
    s += &format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>5}  {:>7}  {:>6}  {:>6}  {:>5}\n",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
    );
    s
}

/// The start of a row: size in bytes, count, type, op and root (`-1` when none).
pub fn row_head(bytes: u64, count: u64, type_name: &str, op_name: &str, root: i64) -> String {
    format!("{bytes:12}  {count:12}  {type_name:>8}  {op_name:>6}  {root:6}")
}

/// One measurement of a row (out-of-place or in-place): time in µs, bandwidths in GB/s and
/// the wrong elements, `None` when not checked (`N/A`).
pub fn cell(time_us: f64, algbw: f64, busbw: f64, wrong: Option<u64>) -> String {
    let wrong = match wrong {
        Some(w) => format_g(w as f64),
        None => "N/A".to_string(),
    };
    format!("  {}  {:6.2}  {:6.2}  {wrong:>5}", time_str(time_us), algbw, busbw)
}

/// The time as nccl-tests prints it: 7 wide, with 0, 1 or 2 decimals as it grows.
pub fn time_str(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

/// The footer: the count of checked measurements with wrong values, the mean bus bandwidth of
/// every measurement (printed with `%g`), against `min_bw` (nccl-tests' `NCCL_TESTS_MIN_BW`)
/// when given, then `#` and the empty line nccl-tests ends with.
pub fn footer(errors: u64, avg_busbw: f64, min_bw: Option<f64>) -> String {
    let verdict = match min_bw {
        None => "",
        Some(m) if avg_busbw < m * 0.9 => "FAILED",
        Some(_) => "OK",
    };
    format!(
        "# Out of bounds values : {errors} {}\n# Avg bus bandwidth    : {} {verdict}\n#\n\n",
        if errors > 0 { "FAILED" } else { "OK" },
        format_g(avg_busbw)
    )
}

/// C's `%g`: 6 significant digits, fixed notation for exponents -4..6 and scientific (with at
/// least two exponent digits) otherwise, trailing zeros dropped.
pub fn format_g(x: f64) -> String {
    if x.is_nan() {
        return if x.is_sign_negative() { "-nan" } else { "nan" }.to_string();
    }
    if x.is_infinite() {
        return if x < 0.0 { "-inf" } else { "inf" }.to_string();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    // The exponent after rounding to 6 digits decides the notation.
    let sci = format!("{x:.5e}");
    let (mant, exp) = sci.split_once('e').expect("`e` format has an exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mant), exp.abs())
    } else {
        trim(&format!("{x:.*}", (5 - exp) as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout of a real `all_reduce_perf -b 8 -e 128M -f 2 -g 8` report (rows cut to
    /// four, devices to two, numbers fixed).
    const GOLDEN: &str = "\
# nThread 1 nGpus 8 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  40127 on dgx-a100-1 device  0 [0x07] NVIDIA A100-SXM4-80GB
#  Rank  1 Group  0 Pid  40127 on dgx-a100-1 device  1 [0x0f] NVIDIA A100-SXM4-80GB
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
           8             2     float     sum      -1    40.53    0.00    0.00      0    39.76    0.00    0.00      0
     1048576        262144     float     sum      -1    101.2   10.36   18.13      0    100.9   10.39   18.18      0
    33554432       8388608     float     sum      -1    361.3   92.87  162.53      0    360.8   93.00  162.75      0
   134217728      33554432     float     sum      -1    12046   11.14   19.50      0    12001   11.18   19.57      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 50.1113 
#

";

    #[test]
    fn report_matches_nccl_tests_layout() {
        let mut s = header(&Header {
            nthreads: 1,
            ngpus: 8,
            min_bytes: 8,
            max_bytes: 134217728,
            step: 2,
            factor: true,
            warmup_iters: 5,
            iters: 20,
            agg_iters: 1,
            check: 1,
        });
        s += &rank_line(0, 0, 40127, short_host("dgx-a100-1.cluster"), 0, "0x07", "NVIDIA A100-SXM4-80GB");
        s += &rank_line(1, 0, 40127, "dgx-a100-1", 1, "0x0f", "NVIDIA A100-SXM4-80GB");
        s += &columns(false);
        type Cells = [(f64, f64, f64); 2];
        let rows: [(u64, u64, Cells); 4] = [
            (8, 2, [(40.53, 0.0, 0.0), (39.76, 0.0, 0.0)]),
            (1048576, 262144, [(101.2, 10.36, 18.13), (100.9, 10.39, 18.18)]),
            (33554432, 8388608, [(361.3, 92.87, 162.53), (360.8, 93.0, 162.75)]),
            (134217728, 33554432, [(12046.0, 11.14, 19.50), (12001.0, 11.18, 19.57)]),
        ];
        for (bytes, count, cells) in rows {
            s += &row_head(bytes, count, "float", "sum", -1);
            for (t, a, b) in cells {
                s += &cell(t, a, b, Some(0));
            }
            s += "\n";
        }
        s += &footer(0, 50.11134, None);
        assert_eq!(s, GOLDEN);
    }

    #[test]
    fn unchecked_and_rooted_cells() {
        assert_eq!(
            row_head(4096, 1024, "half", "none", 3) + &cell(5.5, 0.74, 0.74, None),
            "        4096          1024      half    none       3     5.50    0.74    0.74    N/A"
        );
        assert_eq!(cell(1e5, 1.0, 1.0, Some(1234567)), "   100000    1.00    1.00  1.23457e+06");
    }

    #[test]
    fn format_g_is_c_like() {
        for (x, want) in [
            (0.0, "0"),
            (1.0, "1"),
            (52.49171, "52.4917"),
            (0.000123456, "0.000123456"),
            (0.0000123456, "1.23456e-05"),
            (123456.0, "123456"),
            (1234567.0, "1.23457e+06"),
            (999999.5, "1e+06"),
            (0.5, "0.5"),
            (f64::INFINITY, "inf"),
        ] {
            assert_eq!(format_g(x), want, "{x}");
        }
        assert_eq!(
            footer(2, 1.5, Some(10.0)),
            "# Out of bounds values : 2 FAILED\n# Avg bus bandwidth    : 1.5 FAILED\n#\n\n"
        );
    }
}

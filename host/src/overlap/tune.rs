//! The overlap tuner: FlashOverlap's pipeline predictor and its search over wave groups.
//!
//! A GEMM of `T` output tiles runs in waves of `W = S − C` tiles (S SMs, C kept for the
//! communication kernel). A [`Plan`] cuts the waves into ordered groups; each group's
//! collective starts when its tiles are done and the previous group's collective has ended.
//! [`predict`] times a plan by that two-stage pipeline, [`tune`] picks the fastest grouping,
//! [`waves_from_order`] turns monitored tile completion orders into the tile order the groups
//! follow, and plans are saved as `key = value` text ([`Plan::to_text`], [`Plan::parse`]).
use super::curve::{BandwidthCurve, Collective, GpuPreset};
use std::fmt;
use std::io::Read;
use std::path::Path;

/// FlashOverlap's tile (`<128,128,32,…>` in its signal tables): 32 KiB of fp16 per tile.
pub const DEFAULT_TILE: Tile = Tile { bm: 128, bn: 128 };

/// SMs kept for communication: FlashOverlap reserves 2 (its wait kernel and NCCL); rsccl's
/// counter-gated kernel runs on up to 4 blocks, so [`Problem::comm_sms`] can say so.
pub const DEFAULT_COMM_SMS: u32 = 2;

/// Fixed cost per group, µs, on top of the collective's own time: rsccl's gated kernel has no
/// launch per group (FlashOverlap pays a wait kernel and an NCCL launch), only its first
/// block's acquire poll of the group counter and the fence after it. An estimate, not measured.
pub const GROUP_SYNC_US: f64 = 2.0;

/// Up to this many waves the search tries every ordered composition (2^(waves−1), 32768 at
/// 16); beyond, it groups waves into units first.
pub const EXHAUSTIVE_MAX_WAVES: u32 = 16;

/// Beyond [`EXHAUSTIVE_MAX_WAVES`], waves are grouped in units of `ceil(waves / 10)`, so at most
/// 10 units and 512 compositions (FlashOverlap's `fast_search`).
pub const QUANTIZED_MAX_UNITS: u32 = 10;

/// FlashOverlap's "avoid cold start" rule: a quantized composition with more than this many
/// groups is skipped when its first group is over [`COLD_START_MAX_FIRST_UNITS`] units.
pub const COLD_START_MAX_GROUPS: usize = 5;

/// See [`COLD_START_MAX_GROUPS`].
pub const COLD_START_MAX_FIRST_UNITS: u32 = 2;

/// The most output tiles a problem may have (M = N = 65536 at 128×128): bounds a plan file's
/// tile order and the order checks' memory.
pub const MAX_TILES: u64 = 1 << 18;

/// The largest of M, N, K accepted; far past any one GEMM's output a collective follows.
pub const MAX_DIM: u32 = 1 << 20;

/// The largest tile side accepted (CUTLASS tiles are 256 at most).
pub const MAX_TILE_DIM: u32 = 1024;

/// The most ranks accepted: a tensor-parallel group, far beyond one node's 8 GPUs.
pub const MAX_RANKS: u32 = 1024;

/// The most SMs accepted (H100 has 132, B200 148).
pub const MAX_SMS: u32 = 1024;

/// The largest plan file read: a tile order of [`MAX_TILES`] tiles takes under 2 MiB.
pub const MAX_PLAN_FILE_BYTES: u64 = 4 << 20;

/// The plan file format's version (`version = 1`).
pub const PLAN_VERSION: u32 = 1;

/// The GEMM output's element type; both are 2 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
}

impl Dtype {
    /// The name on the command line and in plan files: `f16`, `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }

    /// Parses a [`name`](Self::name).
    ///
    /// ```
    /// use rsccl::overlap::tune::Dtype;
    /// assert_eq!(Dtype::from_name("bf16"), Some(Dtype::Bf16));
    /// assert_eq!(Dtype::from_name("f32"), None);
    /// ```
    pub fn from_name(s: &str) -> Option<Dtype> {
        [Dtype::F16, Dtype::Bf16].into_iter().find(|d| d.name() == s)
    }

    /// Bytes per element.
    pub fn bytes(self) -> u32 {
        2
    }
}

/// A GEMM output tile: `bm` rows by `bn` columns, computed by one thread block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    /// Rows (BM).
    pub bm: u32,
    /// Columns (BN).
    pub bn: u32,
}

impl Tile {
    /// Parses `BMxBN`, e.g. `128x128`; each side 1 to [`MAX_TILE_DIM`].
    ///
    /// ```
    /// use rsccl::overlap::tune::Tile;
    /// assert_eq!(Tile::parse("128x256"), Some(Tile { bm: 128, bn: 256 }));
    /// assert_eq!(Tile::parse("128"), None);
    /// ```
    pub fn parse(s: &str) -> Option<Tile> {
        let (a, b) = s.split_once('x')?;
        let side = |v: &str| v.parse::<u32>().ok().filter(|&x| (1..=MAX_TILE_DIM).contains(&x));
        Some(Tile { bm: side(a)?, bn: side(b)? })
    }
}

impl fmt::Display for Tile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.bm, self.bn)
    }
}

/// One GEMM whose `M × N` output feeds a collective: what a plan is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The collective on the output.
    pub coll: Collective,
    /// Ranks of the collective.
    pub ranks: u32,
    /// Output rows.
    pub m: u32,
    /// Output columns.
    pub n: u32,
    /// The reduction dimension.
    pub k: u32,
    /// Output element type.
    pub dtype: Dtype,
    /// Output tile.
    pub tile: Tile,
    /// SMs of the GPU.
    pub sms: u32,
    /// SMs left to communication while the GEMM runs.
    pub comm_sms: u32,
}

/// A problem's input that cannot be planned: the plan key (and, with dashes, the
/// command-line flag) it concerns and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProblemError {
    /// The plan-file key: `m`, `n`, `k`, `tile`, `ranks`, `sms`, `comm_sms`, `groups`,
    /// `tile_order`, `gemm`.
    pub key: &'static str,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for ProblemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`: {}", self.key, self.reason)
    }
}

impl std::error::Error for ProblemError {}

fn problem_err(key: &'static str, reason: String) -> ProblemError {
    ProblemError { key, reason }
}

impl Problem {
    /// A problem with FlashOverlap's defaults (f16, [`DEFAULT_TILE`], [`DEFAULT_COMM_SMS`])
    /// on `gpu`'s SMs.
    ///
    /// ```
    /// use rsccl::overlap::{curve::{Collective, GpuPreset}, tune::Problem};
    ///
    /// let p = Problem::new(Collective::AllReduce, 8, 8192, 8192, 4096, &GpuPreset::A100);
    /// assert_eq!((p.tiles(), p.wave_tiles(), p.waves()), (4096, 106, 39));
    /// ```
    pub fn new(coll: Collective, ranks: u32, m: u32, n: u32, k: u32, gpu: &GpuPreset) -> Problem {
        Problem {
            coll,
            ranks,
            m,
            n,
            k,
            dtype: Dtype::F16,
            tile: DEFAULT_TILE,
            sms: gpu.sms,
            comm_sms: DEFAULT_COMM_SMS,
        }
    }

    /// Checks every field against the limits above and the shape rules (M and N need not be
    /// tile multiples: edge tiles are padded, and rsccl's layout moves their padding too, as
    /// the model counts it — FlashOverlap refuses such shapes), 2 or more ranks, fewer
    /// communication SMs than SMs, and for reduce-scatter a tile that splits evenly over the
    /// ranks (each group's slice is cut into one equal part per rank).
    pub fn validate(&self) -> Result<(), ProblemError> {
        let Tile { bm, bn } = self.tile;
        if !(1..=MAX_TILE_DIM).contains(&bm) || !(1..=MAX_TILE_DIM).contains(&bn) {
            return Err(problem_err("tile", format!("{} has a side outside 1..={MAX_TILE_DIM}", self.tile)));
        }
        for (key, v) in [("m", self.m), ("n", self.n), ("k", self.k)] {
            if !(1..=MAX_DIM).contains(&v) {
                return Err(problem_err(key, format!("{v} is outside 1..={MAX_DIM}")));
            }
        }
        if u64::from(self.tiles_m()) * u64::from(self.tiles_n()) > MAX_TILES {
            return Err(problem_err(
                "m",
                format!(
                    "{}x{} in {} tiles is {} tiles, over the {MAX_TILES} allowed",
                    self.m,
                    self.n,
                    self.tile,
                    u64::from(self.tiles_m()) * u64::from(self.tiles_n())
                ),
            ));
        }
        if !(2..=MAX_RANKS).contains(&self.ranks) {
            return Err(problem_err("ranks", format!("{} is outside 2..={MAX_RANKS}", self.ranks)));
        }
        if self.coll == Collective::ReduceScatter
            && !(u64::from(bm) * u64::from(bn)).is_multiple_of(u64::from(self.ranks))
        {
            return Err(problem_err(
                "ranks",
                format!(
                    "reduce_scatter needs a tile of {} elements to split evenly over {} ranks",
                    bm * bn,
                    self.ranks
                ),
            ));
        }
        if !(1..=MAX_SMS).contains(&self.sms) {
            return Err(problem_err("sms", format!("{} is outside 1..={MAX_SMS}", self.sms)));
        }
        if self.comm_sms >= self.sms {
            return Err(problem_err(
                "comm_sms",
                format!("{} leaves none of the {} SMs to the GEMM", self.comm_sms, self.sms),
            ));
        }
        Ok(())
    }

    /// Tile rows: `ceil(M / BM)`.
    pub fn tiles_m(&self) -> u32 {
        self.m.div_ceil(self.tile.bm)
    }

    /// Tile columns: `ceil(N / BN)`.
    pub fn tiles_n(&self) -> u32 {
        self.n.div_ceil(self.tile.bn)
    }

    /// Output tiles `T = ceil(M/BM) · ceil(N/BN)`.
    pub fn tiles(&self) -> u32 {
        self.tiles_m() * self.tiles_n()
    }

    /// Tiles per wave while overlapped: `W = S − C`, one tile per GEMM SM.
    pub fn wave_tiles(&self) -> u32 {
        self.sms - self.comm_sms
    }

    /// Waves while overlapped: `ceil(T / W)`.
    pub fn waves(&self) -> u32 {
        self.tiles().div_ceil(self.wave_tiles())
    }

    /// Waves of the GEMM alone on all `S` SMs: `ceil(T / S)`.
    pub fn waves_alone(&self) -> u32 {
        self.tiles().div_ceil(self.sms)
    }

    /// Bytes of one output tile.
    pub fn tile_bytes(&self) -> u64 {
        u64::from(self.tile.bm) * u64::from(self.tile.bn) * u64::from(self.dtype.bytes())
    }

    /// Bytes of the whole output, `M · N · 2`.
    pub fn output_bytes(&self) -> u64 {
        u64::from(self.m) * u64::from(self.n) * u64::from(self.dtype.bytes())
    }
}

/// How fast the GEMM runs: a rate, or a measured time of it alone on all SMs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GemmSpeed {
    /// Achievable TFLOP/s on full waves.
    Tflops(f64),
    /// Measured time in µs of the GEMM alone on all SMs.
    MeasuredUs(f64),
}

/// What a prediction assumes about the machine.
#[derive(Clone, Debug, PartialEq)]
pub struct Figures {
    /// The GEMM's speed.
    pub gemm: GemmSpeed,
    /// The collective's bus bandwidth.
    pub curve: BandwidthCurve,
    /// Fixed cost per group, µs ([`GROUP_SYNC_US`]).
    pub group_sync_us: f64,
}

impl Figures {
    /// `gpu`'s assumed figures: its GEMM rate and its alpha-beta collective model for the
    /// problem's collective and ranks.
    pub fn preset(gpu: &GpuPreset, problem: &Problem) -> Figures {
        Figures {
            gemm: GemmSpeed::Tflops(gpu.gemm_tflops),
            curve: BandwidthCurve::model(gpu, problem.coll, problem.ranks),
            group_sync_us: GROUP_SYNC_US,
        }
    }

    /// The time of one full wave in µs: one tile's `2·BM·BN·K` flops on each of the `S` SMs at
    /// the rate, or the measured time over `ceil(T/S)` waves. Errors on a rate or time that is
    /// not positive and finite.
    pub fn wave_us(&self, p: &Problem) -> Result<f64, ProblemError> {
        let ok = |x: f64| x.is_finite() && x > 0.0;
        match self.gemm {
            GemmSpeed::Tflops(r) if ok(r) => {
                let wave_flops =
                    2.0 * f64::from(p.tile.bm) * f64::from(p.tile.bn) * f64::from(p.k) * f64::from(p.sms);
                // TFLOP/s = 10^6 FLOP per µs.
                Ok(wave_flops / (r * 1e6))
            }
            GemmSpeed::MeasuredUs(t) if ok(t) => Ok(t / f64::from(p.waves_alone())),
            GemmSpeed::Tflops(x) | GemmSpeed::MeasuredUs(x) => {
                Err(problem_err("gemm", format!("GEMM rate or time {x} is not a positive number")))
            }
        }
    }
}

/// Which tile goes into which group: the order of tiles the groups take in turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TileOrder {
    /// The GEMM's launch order, `t = row_tile · tiles_n + col_tile`: group boundaries fall
    /// in row bands. The fallback when monitored orders disagree.
    Launch,
    /// The measured completion order (a permutation of `0..T`, from [`waves_from_order`]).
    Measured(Vec<u32>),
}

/// A wave grouping of one problem: waves and tiles per group, and the tile order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The GEMM and collective planned for.
    pub problem: Problem,
    /// Waves per group, in order; they sum to [`Problem::waves`].
    pub group_waves: Vec<u32>,
    /// Tiles per group: `waves · W` each, the last group the remainder; they sum to `T`.
    pub group_tiles: Vec<u32>,
    /// Which tiles the groups take.
    pub order: TileOrder,
}

impl Plan {
    /// A plan of `problem` with `group_waves` (each ≥ 1, summing to the problem's waves) and
    /// `order` (a measured order must be a permutation of `0..T`).
    ///
    /// ```
    /// use rsccl::overlap::{curve::{Collective, GpuPreset}, tune::{Plan, Problem, TileOrder}};
    ///
    /// let p = Problem::new(Collective::AllReduce, 8, 8192, 8192, 4096, &GpuPreset::A100);
    /// let plan = Plan::new(p, vec![10, 29], TileOrder::Launch)?;
    /// assert_eq!(plan.group_tiles, [1060, 3036]);
    /// # Ok::<(), rsccl::overlap::tune::ProblemError>(())
    /// ```
    pub fn new(problem: Problem, group_waves: Vec<u32>, order: TileOrder) -> Result<Plan, ProblemError> {
        problem.validate()?;
        let waves = problem.waves();
        if group_waves.is_empty() || group_waves.contains(&0) {
            return Err(problem_err(
                "groups",
                format!("{group_waves:?}: every group needs at least one wave"),
            ));
        }
        let sum: u64 = group_waves.iter().map(|&w| u64::from(w)).sum();
        if sum != u64::from(waves) {
            return Err(problem_err(
                "groups",
                format!(
                    "the groups' waves sum to {sum}, but the GEMM has {waves} waves of {} tiles",
                    problem.wave_tiles()
                ),
            ));
        }
        if let TileOrder::Measured(hint) = &order {
            check_permutation(hint, problem.tiles()).map_err(|r| problem_err("tile_order", r))?;
        }
        let group_tiles = group_tiles(&problem, &group_waves);
        Ok(Plan { problem, group_waves, group_tiles, order })
    }

    /// Tiles per overlapped wave, `S − C`.
    pub fn wave_tiles(&self) -> u32 {
        self.problem.wave_tiles()
    }

    /// Bytes each group's collective moves (the group's share of the full buffer).
    pub fn group_bytes(&self) -> Vec<u64> {
        self.group_tiles.iter().map(|&t| u64::from(t) * self.problem.tile_bytes()).collect()
    }

    /// Tile indices in the order the groups take them: group 0's first, then group 1's, …
    /// (`0..T` for [`TileOrder::Launch`]).
    pub fn tile_sequence(&self) -> Vec<u32> {
        match &self.order {
            TileOrder::Launch => (0..self.problem.tiles()).collect(),
            TileOrder::Measured(hint) => hint.clone(),
        }
    }

    /// The plan as a `key = value` file that [`Plan::parse`] reads back.
    ///
    /// ```
    /// use rsccl::overlap::{curve::{Collective, GpuPreset}, tune::{Plan, Problem, TileOrder}};
    ///
    /// let p = Problem::new(Collective::ReduceScatter, 4, 8192, 8192, 2048, &GpuPreset::H100);
    /// let plan = Plan::new(p, vec![2, 30], TileOrder::Launch)?;
    /// let text = plan.to_text();
    /// assert!(text.contains("groups = 2,30\n"));
    /// assert_eq!(Plan::parse("plan.txt", &text).unwrap(), plan);
    /// # Ok::<(), rsccl::overlap::tune::ProblemError>(())
    /// ```
    pub fn to_text(&self) -> String {
        let p = &self.problem;
        let list = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let order = match &self.order {
            TileOrder::Launch => "launch".to_string(),
            TileOrder::Measured(hint) => list(hint),
        };
        format!(
            "# rsccl overlap plan: wave groups of a GEMM whose output feeds a collective\n\
             version = {PLAN_VERSION}\ncoll = {}\nranks = {}\nm = {}\nn = {}\nk = {}\ndtype = {}\ntile = {}\n\
             sms = {}\ncomm_sms = {}\nwave_tiles = {}\n# waves per group, then tiles per group\n\
             groups = {}\ntiles = {}\n# launch (row-major tile index) or the measured tile order\ntile_order = {order}\n",
            p.coll,
            p.ranks,
            p.m,
            p.n,
            p.k,
            p.dtype.name(),
            p.tile,
            p.sms,
            p.comm_sms,
            p.wave_tiles(),
            list(&self.group_waves),
            list(&self.group_tiles),
        )
    }

    /// Parses a plan file (`file` names it in errors): `key = value` lines, `#` comment
    /// lines and blank lines; every key of [`to_text`](Self::to_text) exactly once, no
    /// others. `wave_tiles` and `tiles` are checked against what the other keys give.
    pub fn parse(file: &str, text: &str) -> Result<Plan, PlanError> {
        let mut fields = Fields { file, found: [None; PLAN_KEYS.len()] };
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let l = raw.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let Some((key, value)) = l.split_once('=') else {
                return Err(fields.err(Some(line), None, format!("`{l}` is not `key = value`")));
            };
            let (key, value) = (key.trim(), value.trim());
            let Some(slot) = PLAN_KEYS.iter().position(|k| *k == key) else {
                let known = PLAN_KEYS.join(", ");
                return Err(fields.err(Some(line), Some(key), format!("unknown key (known: {known})")));
            };
            if let Some((first, _)) = fields.found[slot] {
                return Err(fields.err(
                    Some(line),
                    Some(key),
                    format!("given twice (first on line {first})"),
                ));
            }
            fields.found[slot] = Some((line, value));
        }
        let version = fields.num("version")?;
        if version != PLAN_VERSION {
            return Err(fields.err(
                fields.line("version"),
                Some("version"),
                format!("{version}: only {PLAN_VERSION} is known"),
            ));
        }
        let problem = Problem {
            coll: fields.named("coll", Collective::from_name, "all_reduce, reduce_scatter or all_to_all")?,
            ranks: fields.num("ranks")?,
            m: fields.num("m")?,
            n: fields.num("n")?,
            k: fields.num("k")?,
            dtype: fields.named("dtype", Dtype::from_name, "f16 or bf16")?,
            tile: fields.named("tile", Tile::parse, "BMxBN, e.g. 128x128")?,
            sms: fields.num("sms")?,
            comm_sms: fields.num("comm_sms")?,
        };
        let at = |e: ProblemError| fields.err(fields.line(e.key), Some(e.key), e.reason);
        problem.validate().map_err(at)?;
        let wave_tiles = fields.num("wave_tiles")?;
        if wave_tiles != problem.wave_tiles() {
            return Err(fields.err(
                fields.line("wave_tiles"),
                Some("wave_tiles"),
                format!("{wave_tiles}, but sms − comm_sms = {}", problem.wave_tiles()),
            ));
        }
        let order = match fields.get("tile_order")?.1 {
            "launch" => TileOrder::Launch,
            _ => TileOrder::Measured(fields.list("tile_order")?),
        };
        let plan = Plan::new(problem, fields.list("groups")?, order).map_err(at)?;
        let tiles = fields.list("tiles")?;
        if tiles != plan.group_tiles {
            return Err(fields.err(
                fields.line("tiles"),
                Some("tiles"),
                format!(
                    "`{}`, but the groups' waves give {:?}",
                    cut(fields.get("tiles")?.1),
                    plan.group_tiles
                ),
            ));
        }
        Ok(plan)
    }

    /// Reads a plan file (at most [`MAX_PLAN_FILE_BYTES`]).
    pub fn load(path: &Path) -> Result<Plan, PlanError> {
        let file = path.display().to_string();
        let io = |reason: String| PlanError { file: file.clone(), line: None, key: None, reason };
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_PLAN_FILE_BYTES + 1).read_to_end(&mut bytes))
            .map_err(|e| io(format!("cannot read: {e}")))?;
        if bytes.len() as u64 > MAX_PLAN_FILE_BYTES {
            return Err(io(format!("over {MAX_PLAN_FILE_BYTES} bytes, too large for a plan")));
        }
        let text = String::from_utf8(bytes).map_err(|e| io(format!("not UTF-8 text: {e}")))?;
        Plan::parse(&file, &text)
    }
}

/// A plan file that cannot be read: the file, the line and key when one is at fault, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanError {
    /// The file.
    pub file: String,
    /// 1-based line, when one line is at fault.
    pub line: Option<usize>,
    /// The key concerned, if any.
    pub key: Option<String>,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        match &self.key {
            Some(k) => write!(f, ": `{k}`: {}", self.reason),
            None => write!(f, ": {}", self.reason),
        }
    }
}

impl std::error::Error for PlanError {}

/// At most 60 characters of a value, for messages about long lists.
fn cut(v: &str) -> String {
    match v.char_indices().nth(60) {
        Some((i, _)) => format!("{}…", &v[..i]),
        None => v.to_string(),
    }
}

/// The keys of a plan file, in the order [`Plan::to_text`] writes them.
const PLAN_KEYS: [&str; 14] = [
    "version",
    "coll",
    "ranks",
    "m",
    "n",
    "k",
    "dtype",
    "tile",
    "sms",
    "comm_sms",
    "wave_tiles",
    "groups",
    "tiles",
    "tile_order",
];

/// A plan file's `key = value` lines, read: (line, value) per key of [`PLAN_KEYS`].
struct Fields<'a> {
    file: &'a str,
    found: [Option<(usize, &'a str)>; PLAN_KEYS.len()],
}

impl<'a> Fields<'a> {
    fn err(&self, line: Option<usize>, key: Option<&str>, reason: String) -> PlanError {
        PlanError { file: self.file.to_string(), line, key: key.map(str::to_string), reason }
    }

    fn slot(key: &str) -> usize {
        PLAN_KEYS.iter().position(|k| *k == key).expect("a plan key")
    }

    /// The line of `key`, if given.
    fn line(&self, key: &str) -> Option<usize> {
        self.found[Self::slot(key)].map(|(l, _)| l)
    }

    /// The line and value of `key`, or an error saying it is missing.
    fn get(&self, key: &'static str) -> Result<(usize, &'a str), PlanError> {
        self.found[Self::slot(key)].ok_or_else(|| self.err(None, Some(key), "missing".into()))
    }

    fn num(&self, key: &'static str) -> Result<u32, PlanError> {
        let (line, v) = self.get(key)?;
        v.parse().map_err(|_| self.err(Some(line), Some(key), format!("`{}` is not a whole number", cut(v))))
    }

    fn list(&self, key: &'static str) -> Result<Vec<u32>, PlanError> {
        let (line, v) = self.get(key)?;
        v.split(',').map(|x| x.trim().parse::<u32>()).collect::<Result<_, _>>().map_err(|_| {
            self.err(
                Some(line),
                Some(key),
                format!("`{}` is not a comma-separated list of whole numbers", cut(v)),
            )
        })
    }

    /// A value one of a few names (or a tile shape) parsed by `parse`.
    fn named<T>(
        &self,
        key: &'static str,
        parse: fn(&str) -> Option<T>,
        expected: &str,
    ) -> Result<T, PlanError> {
        let (line, v) = self.get(key)?;
        parse(v).ok_or_else(|| self.err(Some(line), Some(key), format!("`{}`: expected {expected}", cut(v))))
    }
}

/// Tiles per group: `waves · W` for each group, the last taking the remainder of `T`.
/// `group_waves` must sum to the problem's waves ([`Plan::new`] checks).
fn group_tiles(problem: &Problem, group_waves: &[u32]) -> Vec<u32> {
    let w = problem.wave_tiles();
    let mut left = problem.tiles();
    let mut out: Vec<u32> = group_waves.iter().map(|&g| g * w).collect();
    if let Some((last, rest)) = out.split_last_mut() {
        left -= rest.iter().sum::<u32>();
        *last = left;
    }
    out
}

/// A plan's predicted times, µs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    /// One overlapped wave (and one wave alone: a wave's tiles take the same time on fewer SMs).
    pub wave_us: f64,
    /// The GEMM alone on all SMs: `ceil(T/S)` waves.
    pub gemm_alone_us: f64,
    /// The GEMM on `S − C` SMs: `ceil(T/(S−C))` waves.
    pub gemm_overlapped_us: f64,
    /// The collective on the whole output at once.
    pub comm_alone_us: f64,
    /// GEMM alone, then the collective.
    pub sequential_us: f64,
    /// The pipeline of the plan's groups ([`pipeline_us`]).
    pub overlapped_us: f64,
    /// `sequential_us / overlapped_us`.
    pub speedup: f64,
}

/// The two-stage pipeline's end time, µs: group `i`'s GEMM waves end at `wave_us ·
/// (waves of groups ≤ i)`; its collective starts at the later of that and the end of group
/// `i−1`'s collective, and takes `sync_us + comm_us[i]`. FlashOverlap's `predict_lat`, with a
/// fixed per-group cost.
///
/// ```
/// use rsccl::overlap::tune::pipeline_us;
/// // GEMM groups end at 20 and 50; collectives 20+2+15 = 37, then max(50, 37)+2+40 = 92.
/// assert_eq!(pipeline_us(10.0, &[2, 3], &[15.0, 40.0], 2.0), 92.0);
/// ```
pub fn pipeline_us(wave_us: f64, group_waves: &[u32], comm_us: &[f64], sync_us: f64) -> f64 {
    let (mut gemm_end, mut comm_end) = (0.0f64, 0.0f64);
    for (&w, &c) in group_waves.iter().zip(comm_us) {
        gemm_end += wave_us * f64::from(w);
        comm_end = gemm_end.max(comm_end) + sync_us + c;
    }
    comm_end
}

/// The times of `plan` under `figures`: the GEMM's waves rescaled from `S` SMs to `S − C`
/// as FlashOverlap does, each group's collective on its tiles' bytes, and the pipeline.
pub fn predict(plan: &Plan, figures: &Figures) -> Result<Prediction, ProblemError> {
    let p = &plan.problem;
    let wave_us = figures.wave_us(p)?;
    let comm: Vec<f64> =
        plan.group_bytes().iter().map(|&b| figures.curve.time_us(p.coll, b, p.ranks)).collect();
    Ok(prediction(p, figures, wave_us, pipeline_us(wave_us, &plan.group_waves, &comm, figures.group_sync_us)))
}

/// The fixed parts of a prediction around a pipeline time.
fn prediction(p: &Problem, figures: &Figures, wave_us: f64, overlapped_us: f64) -> Prediction {
    let gemm_alone_us = wave_us * f64::from(p.waves_alone());
    let comm_alone_us = figures.curve.time_us(p.coll, p.output_bytes(), p.ranks);
    let sequential_us = gemm_alone_us + comm_alone_us;
    Prediction {
        wave_us,
        gemm_alone_us,
        gemm_overlapped_us: wave_us * f64::from(p.waves()),
        comm_alone_us,
        sequential_us,
        overlapped_us,
        speedup: sequential_us / overlapped_us,
    }
}

/// Every ordered composition of `n` (sequences of positive parts summing to `n`), 2^(n−1) of
/// them, from `[n]` on: composition `i` cuts after the parts whose bits of `i` are set. None
/// for `n = 0`; `n` at most 63.
///
/// ```
/// use rsccl::overlap::tune::compositions;
/// let all: Vec<Vec<u32>> = compositions(3).collect();
/// assert_eq!(all, [vec![3], vec![1, 2], vec![2, 1], vec![1, 1, 1]]);
/// ```
pub fn compositions(n: u32) -> impl Iterator<Item = Vec<u32>> {
    assert!(n <= 63, "compositions of {n}: at most 63 (2^62 of them already)");
    let count = if n == 0 { 0 } else { 1u64 << (n - 1) };
    (0..count).map(move |mask| {
        let mut parts = Vec::new();
        let mut run = 1;
        for bit in 0..n - 1 {
            if mask >> bit & 1 == 1 {
                parts.push(run);
                run = 1;
            } else {
                run += 1;
            }
        }
        parts.push(run);
        parts
    })
}

/// How [`tune`] searched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Search {
    /// Every ordered composition of the waves.
    Exhaustive,
    /// Compositions of units of `unit_waves` waves (the last unit the remainder), skipping
    /// FlashOverlap's cold starts.
    Quantized {
        /// Waves per unit: `ceil(waves / 10)`.
        unit_waves: u32,
        /// Units: `ceil(waves / unit_waves)`.
        units: u32,
        /// Compositions skipped by the cold-start rule.
        skipped: u64,
    },
}

/// The tuner's answer: the best plan, its prediction and how it was found.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// The plan with the least predicted time (ties: fewer groups), in launch tile order.
    pub plan: Plan,
    /// Its predicted times.
    pub prediction: Prediction,
    /// The search used.
    pub search: Search,
    /// Plans predicted.
    pub candidates: u64,
}

/// Picks the wave grouping with the least predicted time: every ordered composition of the
/// waves when there are at most [`EXHAUSTIVE_MAX_WAVES`], else compositions of
/// `ceil(waves/10)`-wave units without cold starts (more than [`COLD_START_MAX_GROUPS`]
/// groups with a first group over [`COLD_START_MAX_FIRST_UNITS`] units). The one-group plan
/// is always a candidate. Ties (within 1e-9 relative) go to fewer groups, then to the first
/// found. The plan uses [`TileOrder::Launch`]; set a measured order from
/// [`TileOrder::from_runs`].
///
/// ```
/// use rsccl::overlap::{curve::{Collective, GpuPreset}, tune::{tune, Figures, Problem}};
///
/// let p = Problem::new(Collective::AllReduce, 8, 8192, 8192, 4096, &GpuPreset::A100);
/// let c = tune(&p, &Figures::preset(&GpuPreset::A100, &p))?;
/// assert_eq!(c.plan.group_tiles.iter().sum::<u32>(), 4096);
/// assert!(c.prediction.speedup > 1.0);
/// # Ok::<(), rsccl::overlap::tune::ProblemError>(())
/// ```
pub fn tune(problem: &Problem, figures: &Figures) -> Result<Choice, ProblemError> {
    problem.validate()?;
    let wave_us = figures.wave_us(problem)?;
    let waves = problem.waves();
    let (unit_waves, units) = if waves <= EXHAUSTIVE_MAX_WAVES {
        (1, waves)
    } else {
        let unit = waves.div_ceil(QUANTIZED_MAX_UNITS);
        (unit, waves.div_ceil(unit))
    };
    let (w, tile_bytes, tiles) = (problem.wave_tiles(), problem.tile_bytes(), problem.tiles());
    let score = |group_waves: &[u32]| -> f64 {
        let mut left = tiles;
        let comm: Vec<f64> = group_waves
            .iter()
            .enumerate()
            .map(|(i, &g)| {
                let t = if i + 1 == group_waves.len() { left } else { g * w };
                left -= t;
                figures.curve.time_us(problem.coll, u64::from(t) * tile_bytes, problem.ranks)
            })
            .collect();
        pipeline_us(wave_us, group_waves, &comm, figures.group_sync_us)
    };
    let mut best = (vec![waves], score(&[waves]));
    let (mut candidates, mut skipped) = (1u64, 0u64);
    for comp in compositions(units).skip(1) {
        if unit_waves > 1 && comp.len() > COLD_START_MAX_GROUPS && comp[0] > COLD_START_MAX_FIRST_UNITS {
            skipped += 1;
            continue;
        }
        let mut group_waves: Vec<u32> = comp.iter().map(|&u| u * unit_waves).collect();
        // Units cover ceil(waves/unit) · unit ≥ waves: the last group takes what is left.
        let before: u32 = group_waves[..group_waves.len() - 1].iter().sum();
        *group_waves.last_mut().expect("a composition has a part") = waves - before;
        let t = score(&group_waves);
        candidates += 1;
        let tie = (t - best.1).abs() <= 1e-9 * best.1;
        if (t < best.1 && !tie) || (tie && group_waves.len() < best.0.len()) {
            best = (group_waves, t);
        }
    }
    let search =
        if unit_waves == 1 { Search::Exhaustive } else { Search::Quantized { unit_waves, units, skipped } };
    let plan = Plan::new(*problem, best.0, TileOrder::Launch)?;
    Ok(Choice { prediction: prediction(problem, figures, wave_us, best.1), plan, search, candidates })
}

/// Why monitored tile orders give no tile order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OrderError {
    /// No runs, a zero wave size, runs of different lengths or a run that is not a
    /// permutation of `0..T`.
    Invalid(String),
    /// Some wave has fewer tiles that fell in it in every run than it holds: the
    /// completion order does not repeat.
    Inconsistent {
        /// The first short wave.
        wave: u32,
        /// Its tiles that fell in it in every run.
        consistent_tiles: u32,
        /// The tiles the wave holds.
        wave_tiles: u32,
    },
}

impl fmt::Display for OrderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OrderError::Invalid(r) => write!(f, "monitored tile orders: {r}"),
            OrderError::Inconsistent { wave, consistent_tiles, wave_tiles } => write!(
                f,
                "inconsistent tile order: wave {wave} holds {wave_tiles} tiles but only {consistent_tiles} fell in it in every run"
            ),
        }
    }
}

impl std::error::Error for OrderError {}

/// Checks that `order` is a permutation of `0..tiles`.
fn check_permutation(order: &[u32], tiles: u32) -> Result<(), String> {
    if order.len() != tiles as usize {
        return Err(format!("{} tiles listed, the problem has {tiles}", order.len()));
    }
    let mut seen = vec![false; order.len()];
    for &t in order {
        match seen.get_mut(t as usize) {
            None => return Err(format!("tile {t} is not below {tiles}")),
            Some(true) => return Err(format!("tile {t} is listed twice")),
            Some(s) => *s = true,
        }
    }
    Ok(())
}

/// The tile order from monitored completion orders (each run a permutation of `0..T`, tiles
/// in the order they finished): a tile belongs to wave `w` when its position fell in `[w·W,
/// (w+1)·W)` in every run. When every wave is full, returns the tiles wave by wave (within a
/// wave in the first run's order), a permutation of `0..T`; otherwise
/// [`OrderError::Inconsistent`] naming the first short wave (FlashOverlap's `compute_hint`).
///
/// ```
/// use rsccl::overlap::tune::waves_from_order;
/// // Waves of 2: {3, 1} then {0, 2} in both runs, whatever the order inside a wave.
/// assert_eq!(waves_from_order(&[vec![3, 1, 0, 2], vec![1, 3, 2, 0]], 2).unwrap(), [3, 1, 0, 2]);
/// assert!(waves_from_order(&[vec![3, 1, 0, 2], vec![3, 0, 1, 2]], 2).is_err());
/// ```
pub fn waves_from_order(runs: &[Vec<u32>], wave_tiles: u32) -> Result<Vec<u32>, OrderError> {
    let first = runs.first().ok_or_else(|| OrderError::Invalid("no runs".into()))?;
    if wave_tiles == 0 {
        return Err(OrderError::Invalid("a wave of 0 tiles".into()));
    }
    let tiles = u32::try_from(first.len())
        .ok()
        .filter(|&t| u64::from(t) <= MAX_TILES)
        .ok_or_else(|| OrderError::Invalid(format!("{} tiles, over the {MAX_TILES} allowed", first.len())))?;
    // Each run's wave of every tile; u32::MAX marks a tile whose wave differs between runs.
    let mut wave_of = vec![0u32; tiles as usize];
    for (r, run) in runs.iter().enumerate() {
        check_permutation(run, tiles).map_err(|e| OrderError::Invalid(format!("run {r}: {e}")))?;
        for (pos, &t) in run.iter().enumerate() {
            let w = pos as u32 / wave_tiles;
            let slot = &mut wave_of[t as usize];
            if r == 0 {
                *slot = w;
            } else if *slot != w {
                *slot = u32::MAX;
            }
        }
    }
    let waves = tiles.div_ceil(wave_tiles);
    let mut hint = Vec::with_capacity(tiles as usize);
    for w in 0..waves {
        let start = hint.len();
        // The first run lists each wave's positions in order, so its slice holds the wave's tiles.
        let lo = (w * wave_tiles) as usize;
        let hi = ((w + 1) * wave_tiles).min(tiles) as usize;
        hint.extend(first[lo..hi].iter().copied().filter(|&t| wave_of[t as usize] == w));
        let (have, want) = ((hint.len() - start) as u32, (hi - lo) as u32);
        if have < want {
            return Err(OrderError::Inconsistent { wave: w, consistent_tiles: have, wave_tiles: want });
        }
    }
    Ok(hint)
}

impl TileOrder {
    /// The order to plan with from monitored runs: [`TileOrder::Measured`] when
    /// [`waves_from_order`] finds every wave consistent, else [`TileOrder::Launch`] with the
    /// reason — not a failure, as FlashOverlap's "Tuning fails!" is: groups then take tiles
    /// in launch order.
    ///
    /// ```
    /// use rsccl::overlap::tune::TileOrder;
    /// let (order, why) = TileOrder::from_runs(&[vec![0, 1, 2], vec![2, 1, 0]], 1);
    /// assert_eq!(order, TileOrder::Launch);
    /// assert!(why.is_some());
    /// ```
    pub fn from_runs(runs: &[Vec<u32>], wave_tiles: u32) -> (TileOrder, Option<OrderError>) {
        match waves_from_order(runs, wave_tiles) {
            Ok(hint) => (TileOrder::Measured(hint), None),
            Err(e) => (TileOrder::Launch, Some(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overlap::curve::Point;

    /// A problem of `tiles_m × tiles_n` 128×128 tiles on `sms` SMs, 2 for communication.
    fn small(tiles_m: u32, tiles_n: u32, sms: u32) -> Problem {
        Problem {
            coll: Collective::AllReduce,
            ranks: 2,
            m: tiles_m * 128,
            n: tiles_n * 128,
            k: 1024,
            dtype: Dtype::F16,
            tile: DEFAULT_TILE,
            sms,
            comm_sms: 2,
        }
    }

    /// A flat curve: busbw 32.768 GB/s at every size, so a 2-rank all-reduce (factor 1) of a
    /// 32 KiB tile takes exactly 1 µs.
    fn flat() -> BandwidthCurve {
        BandwidthCurve::from_points("flat", vec![Point { bytes: 1, busbw_gbps: 32.768 }]).unwrap()
    }

    /// Figures where a wave takes `wave_us`: measured time `wave_us · ceil(T/S)`.
    fn figures(p: &Problem, wave_us: f64) -> Figures {
        Figures {
            gemm: GemmSpeed::MeasuredUs(wave_us * f64::from(p.waves_alone())),
            curve: flat(),
            group_sync_us: 2.0,
        }
    }

    #[test]
    fn pipeline_matches_hand_computed_two_and_three_group_examples() {
        // Two groups: GEMM ends 20, 50; comm 20+2+15 = 37, max(50,37)+2+40 = 92.
        assert_eq!(pipeline_us(10.0, &[2, 3], &[15.0, 40.0], 2.0), 92.0);
        // Three groups, the second waiting for the first collective: GEMM ends 10, 20, 40;
        // comm 10+2+30 = 42, max(20,42)+2+5 = 49, max(40,49)+2+12 = 63.
        assert_eq!(pipeline_us(10.0, &[1, 1, 2], &[30.0, 5.0, 12.0], 2.0), 63.0);
        // Without the sync cost it is FlashOverlap's predict_lat: 10+30 = 40, 40+5 = 45, 45+12 = 57.
        assert_eq!(pipeline_us(10.0, &[1, 1, 2], &[30.0, 5.0, 12.0], 0.0), 57.0);
    }

    #[test]
    fn predict_uses_group_bytes_wave_rescaling_and_sequential_baseline() {
        // 8×8 = 64 tiles on 12 SMs: 10 per overlapped wave, 7 waves; 6 waves alone.
        let p = small(8, 8, 12);
        assert_eq!((p.tiles(), p.wave_tiles(), p.waves(), p.waves_alone()), (64, 10, 7, 6));
        let plan = Plan::new(p, vec![3, 4], TileOrder::Launch).unwrap();
        assert_eq!(plan.group_tiles, [30, 34]);
        let pr = predict(&plan, &figures(&p, 10.0)).unwrap();
        // Group 0: GEMM 30, comm 30 tiles = 30 µs: 30+2+30 = 62. Group 1: GEMM 70,
        // max(70, 62)+2+34 = 106.
        assert!((pr.overlapped_us - 106.0).abs() < 1e-9, "{pr:?}");
        assert!((pr.gemm_alone_us - 60.0).abs() < 1e-9);
        assert!((pr.gemm_overlapped_us - 70.0).abs() < 1e-9);
        assert!((pr.sequential_us - (60.0 + 64.0)).abs() < 1e-9);
        assert!((pr.speedup - 124.0 / 106.0).abs() < 1e-12);
    }

    #[test]
    fn wave_time_from_rate_counts_full_waves() {
        let p = Problem::new(Collective::AllReduce, 8, 8192, 8192, 4096, &GpuPreset::A100);
        let f = Figures::preset(&GpuPreset::A100, &p);
        let wave = f.wave_us(&p).unwrap();
        // 108 tiles of 2·128·128·4096 flops at 250 TFLOP/s.
        assert!((wave - 108.0 * 2.0 * 128.0 * 128.0 * 4096.0 / 250e6).abs() < 1e-9);
        let bad = Figures { gemm: GemmSpeed::Tflops(0.0), ..f };
        assert_eq!(bad.wave_us(&p).unwrap_err().key, "gemm");
    }

    #[test]
    fn compositions_number_two_to_the_n_minus_one_and_sum_to_n() {
        for n in 1..=12u32 {
            let all: Vec<Vec<u32>> = compositions(n).collect();
            assert_eq!(all.len(), 1 << (n - 1), "{n}");
            assert!(all.iter().all(|c| c.iter().sum::<u32>() == n && !c.contains(&0)));
            let distinct: std::collections::HashSet<_> = all.iter().collect();
            assert_eq!(distinct.len(), all.len());
            assert_eq!(all[0], vec![n]);
        }
        assert_eq!(compositions(0).count(), 0);
    }

    #[test]
    fn exhaustive_search_finds_the_best_composition_and_prefers_fewer_groups_on_ties() {
        let p = small(8, 8, 12);
        let f = figures(&p, 10.0);
        let c = tune(&p, &f).unwrap();
        assert_eq!(c.search, Search::Exhaustive);
        assert_eq!(c.candidates, 64);
        let best = compositions(7)
            .map(|g| predict(&Plan::new(p, g, TileOrder::Launch).unwrap(), &f).unwrap().overlapped_us)
            .fold(f64::INFINITY, f64::min);
        assert!((c.prediction.overlapped_us - best).abs() < 1e-9);
        assert_eq!(c.plan.group_tiles.iter().sum::<u32>(), 64);
        // With free communication every plan ends with the GEMM plus a sync per group
        // chained behind it: the one-group plan wins.
        let free = BandwidthCurve::from_points("fast", vec![Point { bytes: 1, busbw_gbps: 1e12 }]).unwrap();
        let c = tune(&p, &Figures { curve: free, group_sync_us: 0.0, ..f }).unwrap();
        assert_eq!(c.plan.group_waves, [7]);
    }

    #[test]
    fn quantized_search_uses_units_of_a_tenth_and_skips_cold_starts() {
        // 64×64 = 4096 tiles on 108 SMs: 39 waves of 106; units of 4 waves, 10 units.
        let p = Problem::new(Collective::AllReduce, 8, 8192, 8192, 4096, &GpuPreset::A100);
        let c = tune(&p, &Figures::preset(&GpuPreset::A100, &p)).unwrap();
        // Compositions of 10 with more than 5 parts and a first part over 2: first part 3
        // leaves 7 in ≥ 5 parts: C(6,4)+C(6,5)+C(6,6) = 22; first part 4 leaves 6 in ≥ 5:
        // C(5,4)+C(5,5) = 6; first part 5 leaves 5 in 5: 1. 29 in all.
        assert_eq!(c.search, Search::Quantized { unit_waves: 4, units: 10, skipped: 29 });
        assert_eq!(c.candidates, 512 - 29);
        assert_eq!(c.plan.group_waves.iter().sum::<u32>(), 39);
        // Every group but the last is a whole number of units.
        let n = c.plan.group_waves.len();
        assert!(c.plan.group_waves[..n - 1].iter().all(|w| w.is_multiple_of(4)), "{:?}", c.plan.group_waves);
        assert!(c.prediction.speedup > 1.0 && c.prediction.overlapped_us < c.prediction.sequential_us);
    }

    #[test]
    fn problems_outside_the_rules_are_refused_naming_the_key() {
        let ok = small(4, 4, 12);
        // Not a tile multiple is fine: the edge tiles are padded.
        assert_eq!(Problem { m: 1000, n: 300, ..ok }.validate(), Ok(()));
        assert_eq!(Problem { m: 1000, ..ok }.tiles_m(), 8);
        let cases: [(Problem, &str); 7] = [
            (Problem { m: 0, ..ok }, "m"),
            (Problem { n: 0, ..ok }, "n"),
            (Problem { ranks: 1, ..ok }, "ranks"),
            (Problem { comm_sms: 12, ..ok }, "comm_sms"),
            (Problem { sms: 0, ..ok }, "sms"),
            (Problem { coll: Collective::ReduceScatter, ranks: 3, ..ok }, "ranks"),
            (Problem { m: 1 << 20, n: 1 << 20, ..ok }, "m"),
        ];
        for (p, key) in cases {
            assert_eq!(p.validate().unwrap_err().key, key, "{p:?}");
        }
        assert_eq!(Plan::new(ok, vec![1, 1, 1], TileOrder::Launch).unwrap_err().key, "groups");
        assert_eq!(Plan::new(ok, vec![2, 0], TileOrder::Launch).unwrap_err().key, "groups");
        assert_eq!(Plan::new(ok, vec![2], TileOrder::Measured(vec![0; 16])).unwrap_err().key, "tile_order");
    }

    #[test]
    fn consistent_runs_give_a_measured_order_wave_by_wave() {
        // 6 tiles, waves of 4: {5, 0, 3, 1} then {2, 4} in every run.
        let runs = vec![vec![5, 0, 3, 1, 2, 4], vec![0, 1, 5, 3, 4, 2], vec![3, 5, 1, 0, 2, 4]];
        assert_eq!(waves_from_order(&runs, 4).unwrap(), [5, 0, 3, 1, 2, 4]);
        let (order, why) = TileOrder::from_runs(&runs, 4);
        assert_eq!((order, why), (TileOrder::Measured(vec![5, 0, 3, 1, 2, 4]), None));
    }

    #[test]
    fn inconsistent_runs_fall_back_to_the_launch_order() {
        // Tile 1 and tile 2 swap waves between runs: wave 0 has 3 of its 4 tiles.
        let runs = vec![vec![5, 0, 3, 1, 2, 4], vec![5, 0, 3, 2, 1, 4]];
        assert_eq!(
            waves_from_order(&runs, 4).unwrap_err(),
            OrderError::Inconsistent { wave: 0, consistent_tiles: 3, wave_tiles: 4 }
        );
        let (order, why) = TileOrder::from_runs(&runs, 4);
        assert_eq!(order, TileOrder::Launch);
        assert!(matches!(why, Some(OrderError::Inconsistent { .. })));
        // The fallback still makes a plan: groups take tiles 0..T in row-major order.
        let p = small(2, 3, 6);
        let plan = Plan::new(p, vec![1, 1], order).unwrap();
        assert_eq!(plan.group_tiles, [4, 2]);
        assert_eq!(plan.tile_sequence(), [0, 1, 2, 3, 4, 5]);
        for bad in [vec![], vec![vec![0, 1], vec![0, 0]], vec![vec![0, 2]]] {
            assert!(matches!(waves_from_order(&bad, 1), Err(OrderError::Invalid(_))), "{bad:?}");
        }
    }

    #[test]
    fn plan_file_round_trips_with_either_tile_order() {
        let p = small(2, 3, 6);
        for order in [TileOrder::Launch, TileOrder::Measured(vec![5, 0, 3, 1, 2, 4])] {
            let plan = Plan::new(p, vec![1, 1], order).unwrap();
            let text = plan.to_text();
            assert_eq!(Plan::parse("p", &text).unwrap(), plan, "{text}");
        }
    }

    #[test]
    fn plan_file_errors_name_the_line_and_key() {
        let p = small(2, 3, 6);
        let text = Plan::new(p, vec![1, 1], TileOrder::Launch).unwrap().to_text();
        let line_of = |key: &str| text.lines().position(|l| l.starts_with(&format!("{key} ="))).unwrap() + 1;
        let edit = |key: &str, value: &str| {
            text.lines()
                .map(|l| {
                    if l.starts_with(&format!("{key} =")) {
                        format!("{key} = {value}")
                    } else {
                        l.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        let cases = [
            ("m", "12x", "`12x` is not a whole number"),
            ("m", "0", "0 is outside 1..="),
            ("coll", "allreduce", "expected all_reduce"),
            ("groups", "1,x", "not a comma-separated list"),
            ("groups", "1,2", "sum to 3"),
            ("tiles", "3,3", "the groups' waves give [4, 2]"),
            ("wave_tiles", "5", "but sms − comm_sms = 4"),
            ("version", "2", "only 1 is known"),
            ("tile_order", "0,1,2", "3 tiles listed"),
        ];
        for (key, value, want) in cases {
            let e = Plan::parse("p.txt", &edit(key, value)).unwrap_err();
            assert_eq!((e.line, e.key.as_deref()), (Some(line_of(key)), Some(key)), "{e}");
            assert!(e.to_string().starts_with(&format!("p.txt:{}: `{key}`: ", line_of(key))), "{e}");
            assert!(e.reason.contains(want), "{key} = {value}: {e}");
        }
        let e = Plan::parse("p.txt", &format!("{text}colour = blue\n")).unwrap_err();
        assert_eq!((e.line, e.key.as_deref()), (Some(text.lines().count() + 1), Some("colour")));
        assert!(e.reason.starts_with("unknown key"));
        let e = Plan::parse("p.txt", &format!("{text}m = 256\n")).unwrap_err();
        assert!(e.reason.contains(&format!("given twice (first on line {})", line_of("m"))), "{e}");
        let e = Plan::parse("p.txt", &text.replace("k = 1024\n", "")).unwrap_err();
        assert_eq!(e.to_string(), "p.txt: `k`: missing");
        let e = Plan::parse("p.txt", "just words\n").unwrap_err();
        assert_eq!(e.to_string(), "p.txt:1: `just words` is not `key = value`");
    }
}

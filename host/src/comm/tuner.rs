//! The communicator's use of the cost model ([`crate::tuning`]): built once at init from what
//! every rank knows alike (ranks, hosts, channels, `RSCCL_PROTO`), asked per ring call which
//! protocol is fastest for its size among those the connections carry and the variable allows.
//!
//! Where the topology search ran at init, the model reads its graphs (path types, bandwidths,
//! GPU generation); without one it takes every channel as an NVLink-class path of
//! [`ASSUMED_CHANNEL_GBPS`]: the protocols' relative costs (LL's low latency against Simple's
//! bandwidth) are what the choice needs, and every rank derives the same answer.
use super::algorithm::{Algorithm, Protocol};
use crate::error::Result;
use crate::tuning::plugin::{Session, TunerPlugin};
use crate::tuning::plugin_abi::{self, NvlDomainInfo, IGNORE};
use crate::tuning::{
    Algo, AlgoGraphs, Coll, CostTable, CpuKind, Enabled, GraphInput, Proto, ProtoSetting, TuningInput,
    PROTO_VAR,
};
use rsccl_device::coll::Collective;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Bandwidth per channel the model assumes without a topology graph, GB/s (NCCL's search
/// speed for one SM90 NVLink channel).
pub const ASSUMED_CHANNEL_GBPS: f64 = 20.0;

/// Compute capability × 10 the model assumes (the generation of the GPUs rsccl targets).
const ASSUMED_SM: u32 = 90;

/// The cost table and the protocols `RSCCL_PROTO` enables, per communicator.
#[derive(Debug)]
pub(super) struct Tuner {
    /// What the table was built from (rebuilt when a plugin rewrites the constants).
    input: TuningInput,
    table: CostTable,
    /// The NCCL tuner plugin consulted per call (`RSCCL_TUNER_PLUGIN`), if any.
    plugin: Option<PluginUse>,
    enabled: Enabled,
    /// The variable's value, for messages.
    setting: Option<String>,
    /// Whether every rank's ring (tree) connections are on paths LL128 is safe on (set at
    /// init once the connections are made; until then, and where not, LL128 runs only when
    /// forced).
    ll128_safe: Ll128Safe,
    /// Whether the table reads a topology search's graphs.
    searched: bool,
    /// Whether the "forced protocol has no FIFO" warning was given (once per communicator).
    warned: AtomicBool,
}

/// A communicator's tuner plugin session and its last answer (a call's plan asks the same
/// question more than once: which algorithm, then its protocol, then its channels).
#[derive(Debug)]
struct PluginUse {
    session: Session,
    last: Mutex<Option<Answer>>,
    /// Whether a failed `getCollInfo` was reported (once per communicator).
    warned: AtomicBool,
}

/// A plugin's answer for `coll` of `bytes` asked with the cost table `asked`.
#[derive(Clone, Copy, Debug)]
struct Answer {
    coll: Coll,
    bytes: u64,
    asked: plugin_abi::CostTable,
    /// The cheapest entry the call can run after the plugin lowered entries, and the channels
    /// it set (0: none).
    pick: Option<(Algo, Proto)>,
    channels: u32,
}

/// Which line-protocol FIFOs every connection of one algorithm (rings or trees) of the
/// communicator has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LineFifos {
    /// LL FIFOs.
    pub(super) ll: bool,
    /// LL128 FIFOs.
    pub(super) ll128: bool,
}

/// Whether every rank's connections of the rings, and of the trees, are on paths LL128 is
/// safe on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Ll128Safe {
    /// The rings' connections.
    pub(super) ring: bool,
    /// The trees' connections.
    pub(super) tree: bool,
}

/// Fewest threads a ring block is launched with (the Simple primitives' roles need two warps).
const MIN_RING_THREADS: u32 = 64;

impl Tuner {
    /// The tuner of a communicator whose channels the topology search found: `input` from its
    /// system and graphs ([`TuningInput::from_topology`]), `nchannels` the channels derived
    /// from them; `proto` is `RSCCL_PROTO`'s value.
    pub(super) fn searched(mut input: TuningInput, nchannels: usize, proto: Option<&str>) -> Result<Tuner> {
        input.comm_channels = nchannels;
        Tuner::from_input(&input, proto, true)
    }

    /// The tuner of `input`; `searched` whether it comes from a topology search.
    fn from_input(input: &TuningInput, proto: Option<&str>, searched: bool) -> Result<Tuner> {
        let table = CostTable::build(input)?;
        let enabled = Enabled::parse(None, proto)?;
        Ok(Tuner {
            input: input.clone(),
            table,
            plugin: None,
            enabled,
            setting: proto.map(str::to_string),
            ll128_safe: Ll128Safe::default(),
            searched,
            warned: AtomicBool::new(false),
        })
    }

    /// Whether the topology search found paths LL128 is safe on by NCCL's rule for the
    /// rings and for the trees (NVLink between the GPUs, see
    /// [`CostTable::ll128_by_default`]); nothing without a search (the NVLink-class
    /// assumption proves nothing).
    pub(super) fn searched_ll128_paths(&self) -> Ll128Safe {
        if !self.searched {
            return Ll128Safe::default();
        }
        Ll128Safe {
            ring: self.table.ll128_by_default(Algo::Ring),
            tree: self.table.ll128_by_default(Algo::Tree),
        }
    }

    /// The tuner of a communicator of `nranks` ranks on `nnodes` hosts with `nchannels`
    /// channels and no topology search: every channel an NVLink-class path of
    /// [`ASSUMED_CHANNEL_GBPS`]; `proto` is `RSCCL_PROTO`'s value (bad values are errors
    /// naming it).
    pub(super) fn new(nranks: usize, nnodes: usize, nchannels: usize, proto: Option<&str>) -> Result<Tuner> {
        let graph = GraphInput::nvlink(nchannels.div_ceil(2).max(1), ASSUMED_CHANNEL_GBPS);
        let input = crate::tuning::TuningInput {
            nranks,
            nnodes: nnodes.clamp(1, nranks.max(1)),
            sm_min: ASSUMED_SM,
            sm_max: ASSUMED_SM,
            cpu: CpuKind::Intel,
            comm_channels: nchannels,
            nvls_channels: 0,
            nvls: false,
            coll_net: false,
            graphs: AlgoGraphs {
                ring: graph.clone(),
                tree: graph,
                coll_net_direct: GraphInput::none(),
                coll_net_chain: GraphInput::none(),
                nvls: GraphInput::none(),
            },
        };
        Tuner::from_input(&input, proto, false)
    }

    /// Starts `plugin` for this communicator (`comm_id`, the same on every rank; `hosts`: its
    /// ranks per host, its NVLink domains): a v5/v6 plugin may rewrite the constants, and the
    /// table is rebuilt from them.
    pub(super) fn attach_plugin(
        &mut self,
        plugin: &Arc<TunerPlugin>,
        comm_id: u64,
        hosts: &[usize],
    ) -> Result<()> {
        let int = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        let domains = NvlDomainInfo {
            n_nvl_domains: int(hosts.len()),
            min_ranks_per_nvl_domain: int(hosts.iter().copied().min().unwrap_or(0)),
            max_ranks_per_nvl_domain: int(hosts.iter().copied().max().unwrap_or(0)),
        };
        let (session, table) = plugin.start(comm_id, &self.input, domains)?;
        self.table = table;
        self.plugin = Some(PluginUse { session, last: Mutex::new(None), warned: AtomicBool::new(false) });
        Ok(())
    }

    /// The hosts the communicator's ranks are on (NCCL's `nNodes`).
    pub(super) fn nnodes(&self) -> usize {
        self.input.nnodes
    }

    /// Whether a tuner plugin is attached.
    pub(super) fn has_plugin(&self) -> bool {
        self.plugin.is_some()
    }

    /// A new call's planning begins: the plugin's answer to the last call is not this one's
    /// (NCCL asks a plugin once per collective).
    pub(super) fn begin_call(&self) {
        if let Some(pu) = &self.plugin {
            *pu.last.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }

    /// The cost table a plugin is asked with for `coll` of `bytes` among `candidates` (each
    /// algorithm with its connections' FIFOs): the model's time of every entry the call can run
    /// there ([`Tuner::allowed`], carried), [`IGNORE`] elsewhere (NCCL's `updateCollCostTable`).
    fn asked(&self, coll: Coll, bytes: u64, candidates: &[(Algo, LineFifos)]) -> plugin_abi::CostTable {
        self.table.plugin_table(coll, bytes, |algo, p| {
            candidates.iter().any(|&(a, fifos)| {
                let carried = match p {
                    Proto::Simple => true,
                    Proto::Ll => fifos.ll,
                    Proto::Ll128 => fifos.ll128,
                };
                a == algo && carried && self.allowed(coll, algo, p)
            })
        })
    }

    /// The plugin's answer for `coll` of `bytes` asked with `asked`: the entries it lowers, the
    /// cheapest the call can run wins (ties: NCCL's order). `None` without a plugin, with
    /// nothing to run, or when the plugin fails (reported once; the model decides).
    fn plugin_answer(&self, coll: Coll, bytes: u64, asked: plugin_abi::CostTable) -> Option<Answer> {
        let pu = self.plugin.as_ref()?;
        if asked.iter().flatten().all(|&t| t == IGNORE) {
            return None;
        }
        let mut last = pu.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = last.filter(|a| a.coll == coll && a.bytes == bytes && a.asked == asked) {
            return Some(a);
        }
        let (pick, channels) = match pu.session.pick(coll, bytes, &asked) {
            Ok(answer) => answer,
            Err(e) => {
                if !pu.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!("{e}: the cost model decides instead");
                }
                return None;
            }
        };
        let answer = Answer { coll, bytes, asked, pick, channels };
        tracing::trace!("TUNER/Plugin: {coll} of {bytes} bytes: {:?}, {channels} channels", answer.pick);
        *last = Some(answer);
        Some(answer)
    }

    /// The algorithm a tuner plugin picks for `coll` of `bytes` among `candidates` (each with
    /// its connections' FIFOs: NVLS and NVLS_TREE carry Simple alone), as NCCL asks it with
    /// every algorithm the call can run on; `None` without a plugin or an answer (the caller's
    /// own order decides). A later question for the protocol on the picked algorithm reuses
    /// this answer ([`Tuner::protocol`]).
    pub(super) fn plugin_algorithm(
        &self,
        coll: Collective,
        bytes: u64,
        candidates: &[(Algo, LineFifos)],
    ) -> Option<Algo> {
        self.plugin.as_ref()?;
        let coll = Coll::of(coll);
        let asked = self.asked(coll, bytes, candidates);
        self.plugin_answer(coll, bytes, asked)?.pick.map(|(algo, _)| algo)
    }

    /// The plugin's protocol (and channels) for `coll` of `bytes` on `algo`: from its last
    /// answer where that was for this call, picked `algo` and was asked with the same choice
    /// of `algo`'s protocols (a plan's later question), else from a new question among
    /// `algo`'s protocols alone.
    fn plugin_pick_on(&self, algo: Algo, coll: Coll, bytes: u64, fifos: LineFifos) -> Option<(Proto, u32)> {
        let pu = self.plugin.as_ref()?;
        let asked = self.asked(coll, bytes, &[(algo, fifos)]);
        let last = *pu.last.lock().unwrap_or_else(|p| p.into_inner());
        let prior = last.filter(|a| {
            a.coll == coll
                && a.bytes == bytes
                && a.asked[algo.index()] == asked[algo.index()]
                && a.pick.is_some_and(|(x, _)| x == algo)
        });
        let a = match prior {
            Some(a) => a,
            None => self.plugin_answer(coll, bytes, asked)?,
        };
        a.pick.filter(|&(x, _)| x == algo).map(|(_, p)| (p, a.channels))
    }

    /// Whether some collective may run LL128 (`RSCCL_PROTO` does not turn it off for all):
    /// ring connections then get LL128 FIFOs.
    pub(super) fn ll128_possible(&self) -> bool {
        Coll::ALL.iter().any(|&c| self.enabled.proto(c, Proto::Ll128) != ProtoSetting::Off)
    }

    /// Whether `RSCCL_PROTO` forces LL128 on some collective.
    pub(super) fn ll128_forced(&self) -> bool {
        Coll::ALL.iter().any(|&c| self.enabled.proto(c, Proto::Ll128) == ProtoSetting::On)
    }

    /// Records whether every ring and tree connection of every rank is on a path LL128 is
    /// safe on.
    pub(super) fn set_ll128_safe(&mut self, safe: Ll128Safe) {
        self.ll128_safe = safe;
    }

    /// Whether `p` may run `coll` on `algo` (rings or trees): `RSCCL_PROTO` on, or left to
    /// auto — LL128 then only where that algorithm's paths are safe and NCCL's rule enables it.
    fn allowed(&self, coll: Coll, algo: Algo, p: Proto) -> bool {
        if p == Proto::Ll128 && self.enabled.proto(coll, p) == ProtoSetting::Auto {
            let safe = if algo == Algo::Tree { self.ll128_safe.tree } else { self.ll128_safe.ring };
            return self.enabled.algo(coll, algo) && safe && self.table.ll128_by_default(algo);
        }
        self.table.allows(&self.enabled, coll, algo, p)
    }

    /// Whether `RSCCL_PROTO` leaves LL on for `coll` (the symmetric LL kernel runs only then).
    pub(super) fn ll_enabled(&self, coll: Collective) -> bool {
        self.enabled.proto(Coll::of(coll), Proto::Ll) != ProtoSetting::Off
    }

    /// The protocol `coll` of `bytes` (NCCL's `nBytes`: the larger of the send and receive
    /// buffers) runs with on `algorithm` (the rings or the trees): the fastest of Simple, LL
    /// and LL128 among those `fifos` (that algorithm's connections) carries and
    /// [`Tuner::allowed`] allows, Simple when nothing else is. A protocol forced on where the
    /// connections lack it falls back to Simple with a warning (once).
    pub(super) fn protocol(
        &self,
        algorithm: Algorithm,
        coll: Collective,
        bytes: u64,
        fifos: LineFifos,
    ) -> Protocol {
        self.best(algo_of(algorithm), coll, bytes, fifos).0
    }

    /// [`Tuner::protocol`] on `algo` and its predicted time, µs (infinite when the table has
    /// none).
    fn best(&self, algo: Algo, coll: Collective, bytes: u64, fifos: LineFifos) -> (Protocol, f64) {
        let coll = Coll::of(coll);
        if let Some((p, _)) = self.plugin_pick_on(algo, coll, bytes, fifos) {
            let t = self.table.time_us(coll, algo, p, bytes, 1).unwrap_or(0.0);
            return (protocol_of(p), t);
        }
        let mut best = (Protocol::Simple, f64::INFINITY);
        let candidates = [
            (Proto::Simple, Protocol::Simple, true),
            (Proto::Ll, Protocol::Ll, fifos.ll),
            (Proto::Ll128, Protocol::Ll128, fifos.ll128),
        ];
        for (p, ours, carried) in candidates {
            if !carried || !self.allowed(coll, algo, p) {
                continue;
            }
            if let Some(t) = self.table.time_us(coll, algo, p, bytes, 1) {
                if t < best.1 {
                    best = (ours, t);
                }
            }
        }
        for (p, carried) in [(Proto::Ll, fifos.ll), (Proto::Ll128, fifos.ll128)] {
            if !carried
                && self.enabled.proto(coll, p) == ProtoSetting::On
                && !self.warned.swap(true, Ordering::Relaxed)
            {
                tracing::warn!(
                    "{PROTO_VAR}={} asks for {} on {coll}, but a {} connection has no {} FIFO, a rank's GPU \
                     has no such kernels (LL128 below sm_90) or a gated group's launch runs the call (no \
                     LL128 there): running {}",
                    self.setting.as_deref().unwrap_or(""),
                    p.name(),
                    if algo == Algo::Tree { "tree" } else { "ring" },
                    p.name(),
                    best.0.name()
                );
            }
        }
        best
    }

    /// Whether the tree on its best protocol among `tree` (its connections' FIFOs) is
    /// predicted faster than the ring on its best among `ring` for an all-reduce of `bytes`,
    /// each allowed by `RSCCL_PROTO` (NCCL's algorithm choice between the two).
    pub(super) fn tree_beats_ring(&self, bytes: u64, ring: LineFifos, tree: LineFifos) -> bool {
        if !self.enabled.algo(Coll::AllReduce, Algo::Tree) {
            return false;
        }
        if let Some(pu) = &self.plugin {
            let asked = self.asked(Coll::AllReduce, bytes, &[(Algo::Tree, tree), (Algo::Ring, ring)]);
            // This call's answer already picked the ring or the tree (asked with NVLS too,
            // [`Tuner::plugin_algorithm`]) with the same entries for both: it stands.
            let last = *pu.last.lock().unwrap_or_else(|p| p.into_inner());
            let prior = last.filter(|a| {
                a.coll == Coll::AllReduce
                    && a.bytes == bytes
                    && [Algo::Tree, Algo::Ring].iter().all(|x| a.asked[x.index()] == asked[x.index()])
                    && a.pick.is_some_and(|(x, _)| matches!(x, Algo::Tree | Algo::Ring))
            });
            if let Some(a) = prior.or_else(|| self.plugin_answer(Coll::AllReduce, bytes, asked)) {
                if let Some((algo, _)) = a.pick {
                    return algo == Algo::Tree;
                }
            }
        }
        let tree = self.best(Algo::Tree, Collective::AllReduce, bytes, tree).1;
        let ring = self.best(Algo::Ring, Collective::AllReduce, bytes, ring).1;
        ring.is_finite() && tree < ring
    }

    /// Whether one of `others` (the rings or the trees, each with its connections' FIFOs) on
    /// its best protocol is predicted faster for `coll` of `bytes` than `nvls` (NVLS or
    /// NVLS_TREE) on Simple, the only protocol it has; NVLS counts as infinitely slow where
    /// `RSCCL_PROTO` leaves Simple out. `false` where the table has no entry for `nvls`.
    pub(super) fn nvls_loses(
        &self,
        nvls: Algo,
        coll: Collective,
        bytes: u64,
        others: &[(Algo, LineFifos)],
    ) -> bool {
        let c = Coll::of(coll);
        let Some(t) = self.table.time_us(c, nvls, Proto::Simple, bytes, 1) else {
            return false;
        };
        let t = if self.table.allows(&self.enabled, c, nvls, Proto::Simple) { t } else { f64::INFINITY };
        others.iter().any(|&(a, fifos)| self.best(a, coll, bytes, fifos).1 < t)
    }

    /// The launch shape of a ring or tree call (`algorithm`) on `protocol` moving `bytes`:
    /// NCCL's channel and thread shrink for small sizes ([`CostTable::launch_shape`]), kept
    /// within the communicator's channels and its block size `max_threads` (whole warps, at
    /// least [`MIN_RING_THREADS`]). Every rank computes the same shape for the same call.
    pub(super) fn shape(
        &self,
        algorithm: Algorithm,
        coll: Collective,
        protocol: Protocol,
        bytes: u64,
        max_threads: u32,
    ) -> (u32, u32) {
        let (algo, proto) = (algo_of(algorithm), proto_of(protocol));
        let (nc, nt) = self.table.launch_shape(algo, proto, bytes);
        // Channels a tuner plugin set with its pick for this call (NCCL: they override the
        // model's shrink).
        let set = self.plugin.as_ref().and_then(|pu| {
            let last = *pu.last.lock().unwrap_or_else(|p| p.into_inner());
            last.filter(|a| a.coll == Coll::of(coll) && a.bytes == bytes && a.pick == Some((algo, proto)))
                .map(|a| a.channels)
                .filter(|&c| c > 0)
        });
        let nc = set.unwrap_or(nc).clamp(1, self.table.comm_channels().max(1) as u32);
        let nt = (nt.min(max_threads) / 32 * 32).clamp(MIN_RING_THREADS.min(max_threads), max_threads);
        (nc, nt)
    }

    /// Predicted time of `coll` of `bytes` on `algorithm` with `protocol`, µs; algorithms
    /// without an entry here are timed as the ring ([`super::Comm::estimate`]).
    pub(super) fn time_us(
        &self,
        coll: Collective,
        algorithm: Algorithm,
        protocol: Protocol,
        bytes: u64,
    ) -> f64 {
        let coll = Coll::of(coll);
        let proto = proto_of(protocol);
        let algo = algo_of(algorithm);
        self.table
            .time_us(coll, algo, proto, bytes, 1)
            .or_else(|| self.table.time_us(coll, Algo::Ring, proto, bytes, 1))
            .unwrap_or(0.0)
    }

    /// The time of the symmetric LL all-reduce of `bytes` on `blocks` blocks, µs: NCCL's
    /// symmetric-kernel model ([`CostTable::sym_ll_all_reduce_us`]).
    pub(super) fn sym_ll_us(&self, bytes: u64, blocks: u32) -> f64 {
        self.table.sym_ll_all_reduce_us(bytes, blocks)
    }

    /// The cost table in NCCL's TUNING layout, with what `RSCCL_PROTO` enables.
    pub(super) fn render(&self) -> String {
        self.table.render(&self.enabled)
    }
}

/// The cost model's name of `algorithm` (those it has no entry for are timed as the ring).
fn algo_of(algorithm: Algorithm) -> Algo {
    match algorithm {
        Algorithm::Tree => Algo::Tree,
        Algorithm::Nvls | Algorithm::NvlsSymmetric => Algo::Nvls,
        Algorithm::NvlsTree => Algo::NvlsTree,
        Algorithm::Ring | Algorithm::Msccl(_) | Algorithm::P2p | Algorithm::SymLl => Algo::Ring,
    }
}

/// The protocol of the cost model's `proto`.
fn protocol_of(proto: Proto) -> Protocol {
    match proto {
        Proto::Simple => Protocol::Simple,
        Proto::Ll => Protocol::Ll,
        Proto::Ll128 => Protocol::Ll128,
    }
}

/// The cost model's name of `protocol`.
fn proto_of(protocol: Protocol) -> Proto {
    match protocol {
        Protocol::Simple => Proto::Simple,
        Protocol::Ll => Proto::Ll,
        Protocol::Ll128 => Proto::Ll128,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINES: LineFifos = LineFifos { ll: true, ll128: false };

    /// On one node the model never prefers the tree; across nodes it takes the tree where
    /// its log-depth latency or bandwidth wins, and the ring again where it does not.
    #[test]
    fn the_tree_wins_only_where_the_model_says_so() {
        let sizes: Vec<u64> = (3..=32).map(|p| 1u64 << p).collect();
        let one = Tuner::new(8, 1, 2, None).unwrap();
        assert!(!sizes.iter().any(|&b| one.tree_beats_ring(b, LINES, LINES)));
        let many = Tuner::new(32, 4, 2, None).unwrap();
        let wins: Vec<u64> =
            sizes.iter().copied().filter(|&b| many.tree_beats_ring(b, LINES, LINES)).collect();
        assert!(!wins.is_empty(), "4 nodes: the tree never wins");
        assert!(!many.tree_beats_ring(1 << 32, LINES, LINES), "4 GB: the ring's bandwidth wins");
        for &b in &wins {
            let tree = [Proto::Simple, Proto::Ll]
                .map(|p| many.table.time_us(Coll::AllReduce, Algo::Tree, p, b, 1).unwrap())
                .into_iter()
                .fold(f64::INFINITY, f64::min);
            for p in [Proto::Simple, Proto::Ll] {
                let ring = many.table.time_us(Coll::AllReduce, Algo::Ring, p, b, 1).unwrap();
                assert!(tree < ring, "{b} B: tree {tree} µs vs ring {p} {ring} µs");
            }
        }
        // The tree takes its own best protocol: LL for small sizes, Simple for large.
        let proto = |b| many.protocol(Algorithm::Tree, Collective::AllReduce, b, LINES);
        assert_eq!(proto(64), Protocol::Ll);
        assert_eq!(proto(1 << 30), Protocol::Simple);
        // Without LL FIFOs on the trees, they run Simple.
        let no_ll = LineFifos { ll: false, ll128: false };
        assert_eq!(many.protocol(Algorithm::Tree, Collective::AllReduce, 64, no_ll), Protocol::Simple);
    }

    /// Between GPUs only a topology search vouches for LL128: its graph's NVLink paths do,
    /// PCIe paths (or no search, the NVLink-class assumption) do not.
    #[test]
    fn only_a_searched_nvlink_graph_vouches_for_ll128_between_gpus() {
        use crate::topology::search::{search_all, SearchOptions};
        use crate::topology::{xml, System};
        let searched = |nvlink: bool| {
            let link = |to: &str| {
                if nvlink {
                    format!(r#"<nvlink target="{to}" count="4" tclass="0x030200"/>"#)
                } else {
                    String::new()
                }
            };
            let text = format!(
                r#"<system version="1"><cpu numaid="0" arch="x86_64" vendor="AuthenticAMD">
                <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
                  <gpu dev="0" sm="90" rank="0" gdr="1">{}</gpu></pci>
                <pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
                  <gpu dev="1" sm="90" rank="1" gdr="1">{}</gpu></pci></cpu></system>"#,
                link("0000:02:00.0"),
                link("0000:01:00.0")
            );
            let sys = System::from_xml(&xml::parse(&text, "two.xml").unwrap()).unwrap();
            let graphs = search_all(&sys, &SearchOptions::default());
            let input = TuningInput::from_topology(&sys, &graphs, 1).unwrap();
            Tuner::searched(input, 2, None).unwrap()
        };
        assert!(searched(true).searched_ll128_paths().ring, "NVLink");
        assert!(!searched(false).searched_ll128_paths().ring, "PCIe");
        assert_eq!(Tuner::new(2, 1, 2, None).unwrap().searched_ll128_paths(), Ll128Safe::default());
    }
}

//! The algorithms a communicator may use: `RSCCL_ALGO` (NCCL's `NCCL_ALGO`) as a mask, read
//! once at init; the plan ([`super::Plan`]) chooses among what it allows.
use super::algorithm::Algorithm;
use crate::error::{Error, Result};
use crate::tuning::env::parse_list;
use crate::tuning::Coll;
use rsccl_device::coll::Collective;

/// The variable naming the algorithms a communicator may use (NCCL's `NCCL_ALGO`), defined
/// once with the cost model's grammar.
pub use crate::tuning::ALGO_VAR;

/// What `RSCCL_ALGO` says about NVLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NvlsPolicy {
    /// Where it applies (unset, or NVLS in the allowed list with others).
    Auto,
    /// Only NVLS (`nvls`): a call or communicator it cannot serve is an error.
    Forced,
    /// Never (`^nvls`, or a list without it, or `RSCCL_NVLS_ENABLE=0`).
    Off,
    /// Where it applies, as [`NvlsPolicy::Auto`], but multicast memory that cannot be set up
    /// is an error rather than a fall-back (`RSCCL_NVLS_ENABLE=1`, as NCCL's `NCCL_NVLS_ENABLE=1`).
    Required,
}

/// Whether communicators set NVLS up (NCCL's `NCCL_NVLS_ENABLE`): `0` never (no multicast
/// memory at init; NVLS and NVLS_TREE off whatever `RSCCL_ALGO` allows), `1` where the topology
/// serves it, failing the init when its memory cannot be set up, `2` (the default) where it
/// applies, falling back to the rings when its memory cannot be set up.
pub const NVLS_ENABLE_VAR: &str = "RSCCL_NVLS_ENABLE";

impl NvlsPolicy {
    /// Parses NCCL's syntax: a comma-separated list of `ring`, `tree`, `nvls`, `nvlstree`,
    /// `collnet*`, `pat` (case-insensitive), allowed ones, or excluded ones after a `^`.
    ///
    /// ```
    /// use rsccl::comm::NvlsPolicy;
    /// assert_eq!(NvlsPolicy::parse(None).unwrap(), NvlsPolicy::Auto);
    /// assert_eq!(NvlsPolicy::parse(Some("NVLS")).unwrap(), NvlsPolicy::Forced);
    /// assert_eq!(NvlsPolicy::parse(Some("ring,nvls")).unwrap(), NvlsPolicy::Auto);
    /// assert_eq!(NvlsPolicy::parse(Some("^nvls")).unwrap(), NvlsPolicy::Off);
    /// assert_eq!(NvlsPolicy::parse(Some("ring,tree")).unwrap(), NvlsPolicy::Off);
    /// assert!(NvlsPolicy::parse(Some("warp")).is_err());
    /// ```
    pub fn parse(value: Option<&str>) -> Result<NvlsPolicy> {
        Ok(AlgoMask::parse(value)?.nvls_policy())
    }

    /// Whether NVLS that the topology serves but whose multicast memory cannot be set up (or
    /// that does not come up on every node) fails the init: forced or required.
    pub fn must_come_up(self) -> bool {
        matches!(self, NvlsPolicy::Forced | NvlsPolicy::Required)
    }

    /// The setting that made it so, for messages: `RSCCL_ALGO=nvls` or `RSCCL_NVLS_ENABLE=1`.
    pub(crate) fn setting(self) -> String {
        match self {
            NvlsPolicy::Required => format!("{NVLS_ENABLE_VAR}=1"),
            _ => format!("{ALGO_VAR}=nvls"),
        }
    }
}

/// The algorithms `RSCCL_ALGO` allows (NCCL's `NCCL_ALGO`), per collective, in NCCL's
/// per-function grammar (2.24 on; [`crate::tuning::env`]): entries separated by `;`, the first
/// for every collective, the others prefixed `func:` for one (`broadcast`, `reduce`,
/// `allgather`, `reducescatter`, `allreduce`), each a comma-separated list of `ring`, `tree`,
/// `nvls`, `nvlstree`, `collnet` (both CollNet forms), `collnetdirect`, `collnetchain`, `pat`
/// and rsccl's `symll` (the symmetric LL all-reduce) — the ones allowed, or after a `^` the
/// ones excluded — any case; unset or empty: all. MSCCL programs are outside it (as in MSCCL):
/// a registry program serves the calls it names.
///
/// ```
/// use rsccl::comm::AlgoMask;
/// use rsccl::Algorithm;
/// use rsccl_device::coll::Collective;
/// let m = AlgoMask::parse(Some("ring,NVLS"))?;
/// assert!(m.allows(Algorithm::Ring) && m.allows(Algorithm::NvlsSymmetric) && !m.allows(Algorithm::Tree));
/// assert!(!AlgoMask::parse(Some("^tree"))?.allows(Algorithm::Tree));
/// assert!(AlgoMask::parse(None)?.allows(Algorithm::Tree));
/// assert!(AlgoMask::parse(Some("warp")).is_err());
/// // All-reduce on the trees only, everything else on the rings.
/// let m = AlgoMask::parse(Some("ring;allreduce:tree"))?;
/// assert!(m.allows_for(Collective::AllReduce, Algorithm::Tree));
/// assert!(!m.allows_for(Collective::AllReduce, Algorithm::Ring));
/// assert!(m.allows_for(Collective::AllGather, Algorithm::Ring));
/// # Ok::<(), rsccl::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlgoMask {
    /// One bit per name of [`ALGO_NAMES`], per collective in [`Coll::ALL`]'s order.
    bits: [u16; 5],
    /// `RSCCL_NVLS_ENABLE=1`: NVLS must come up where the topology serves it.
    nvls_required: bool,
}

/// The names `RSCCL_ALGO` knows, in bit order; `collnet` (last) names both CollNet forms.
const ALGO_NAMES: [&str; 9] =
    ["ring", "tree", "nvls", "nvlstree", "collnetdirect", "collnetchain", "pat", "symll", "collnet"];

/// The collectives NVLS serves (the others never run on it).
const NVLS_COLLS: [Coll; 3] = [Coll::AllGather, Coll::ReduceScatter, Coll::AllReduce];

impl AlgoMask {
    const RING: u16 = 1 << 0;
    const TREE: u16 = 1 << 1;
    const NVLS: u16 = 1 << 2;
    const NVLS_TREE: u16 = 1 << 3;
    const COLLNET: u16 = 0b11 << 4;
    const SYM_LL: u16 = 1 << 7;
    const ALL: u16 = (1 << 8) - 1;

    /// Parses NCCL's grammar (see [`AlgoMask`]); an unknown name or collective, or a malformed
    /// entry, is an error naming the variable, the token and where it is.
    pub fn parse(value: Option<&str>) -> Result<AlgoMask> {
        let mut bits = [Self::ALL; 5];
        let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(AlgoMask { bits, nvls_required: false });
        };
        let collnet = ALGO_NAMES.len() - 1;
        for entry in parse_list(ALGO_VAR, v, "algorithm", &ALGO_NAMES)? {
            // An entry sets its collectives' bits; `collnet` names both CollNet forms.
            let mut bits_of_entry = 0u16;
            for i in 0..collnet {
                let named = entry.names(i) || (Self::COLLNET & (1 << i) != 0 && entry.names(collnet));
                if named != entry.excludes() {
                    bits_of_entry |= 1 << i;
                }
            }
            for c in entry.colls() {
                bits[c.index()] = bits_of_entry;
            }
        }
        Ok(AlgoMask { bits, nvls_required: false })
    }

    /// The bits of `coll`.
    fn of(&self, coll: Coll) -> u16 {
        self.bits[coll.index()]
    }

    /// Whether `coll` may run on `algorithm` (the NVLS forms under `nvls`, NVLS_TREE's under
    /// either `nvls` or `nvlstree`; MSCCL and point-to-point always).
    pub fn allows_for(&self, coll: Collective, algorithm: Algorithm) -> bool {
        Self::bit_allows(self.of(Coll::of(coll)), algorithm)
    }

    /// Whether every collective may run on `algorithm` (see [`AlgoMask::allows_for`]).
    pub fn allows(&self, algorithm: Algorithm) -> bool {
        self.bits.iter().all(|&b| Self::bit_allows(b, algorithm))
    }

    fn bit_allows(bits: u16, algorithm: Algorithm) -> bool {
        let bit = match algorithm {
            Algorithm::Ring => Self::RING,
            Algorithm::Tree => Self::TREE,
            Algorithm::Nvls | Algorithm::NvlsSymmetric => Self::NVLS,
            Algorithm::NvlsTree => Self::NVLS | Self::NVLS_TREE,
            Algorithm::SymLl => Self::SYM_LL,
            Algorithm::Msccl(_) | Algorithm::P2p => return true,
        };
        bits & bit != 0
    }

    /// Whether `coll` may run on NVLS alone (`RSCCL_ALGO=nvls`, or `allreduce:nvls`): a call
    /// NVLS cannot serve is an error naming it, and the cost model does not weigh the rings.
    pub fn forces_nvls(&self, coll: Collective) -> bool {
        let b = self.of(Coll::of(coll));
        b & Self::NVLS != 0 && b & !Self::NVLS == 0
    }

    /// What it says about NVLS for the communicator: none where no collective NVLS serves
    /// may use it; forced where one may use nothing else (NVLS must come up at init, or init
    /// fails); else where it applies (required to come up under `RSCCL_NVLS_ENABLE=1`).
    pub fn nvls_policy(&self) -> NvlsPolicy {
        let nvls = |c: &Coll| self.of(*c) & Self::NVLS != 0;
        let only = |c: &Coll| self.of(*c) & Self::NVLS != 0 && self.of(*c) & !Self::NVLS == 0;
        if !NVLS_COLLS.iter().any(nvls) {
            NvlsPolicy::Off
        } else if NVLS_COLLS.iter().any(only) {
            NvlsPolicy::Forced
        } else if self.nvls_required {
            NvlsPolicy::Required
        } else {
            NvlsPolicy::Auto
        }
    }

    /// This mask under `RSCCL_NVLS_ENABLE` = `level` (`None`: unset, as 2): 0 takes NVLS and
    /// NVLS_TREE out (an error when it leaves a collective nothing: `RSCCL_ALGO=nvls`), 1
    /// requires NVLS to come up, 2 leaves it as it is; another value is an error naming the
    /// variable.
    ///
    /// ```
    /// use rsccl::comm::{AlgoMask, NvlsPolicy};
    /// use rsccl::Algorithm;
    /// let all = AlgoMask::parse(None)?;
    /// let off = all.with_nvls_enable(Some(0))?;
    /// assert!(!off.allows(Algorithm::Nvls) && !off.allows(Algorithm::NvlsTree) && off.allows(Algorithm::Ring));
    /// assert_eq!(off.nvls_policy(), NvlsPolicy::Off);
    /// assert_eq!(all.with_nvls_enable(Some(1))?.nvls_policy(), NvlsPolicy::Required);
    /// assert_eq!(all.with_nvls_enable(None)?, all);
    /// assert!(AlgoMask::parse(Some("nvls"))?.with_nvls_enable(Some(0)).is_err());
    /// assert!(AlgoMask::parse(Some("ring;allreduce:nvls"))?.with_nvls_enable(Some(0)).is_err());
    /// assert!(all.with_nvls_enable(Some(3)).is_err());
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn with_nvls_enable(self, level: Option<u64>) -> Result<AlgoMask> {
        match level {
            None | Some(2) => Ok(self),
            Some(1) => Ok(AlgoMask { nvls_required: true, ..self }),
            Some(0) => {
                let mut bits = self.bits;
                for b in bits.iter_mut() {
                    *b &= !(Self::NVLS | Self::NVLS_TREE);
                }
                let emptied = |i: usize| bits[i] & !Self::SYM_LL == 0 && self.bits[i] & !Self::SYM_LL != 0;
                if (0..bits.len()).any(emptied) {
                    return Err(Error::InvalidConfig(format!(
                        "{}, but {NVLS_ENABLE_VAR}=0 turns NVLS off: no algorithm is left",
                        self.describe()
                    )));
                }
                Ok(AlgoMask { bits, nvls_required: false })
            }
            Some(v) => Err(Error::InvalidConfig(format!(
                "{NVLS_ENABLE_VAR}={v}: give 0 (off), 1 (required) or 2 (where it applies)"
            ))),
        }
    }

    /// The variable's text for messages: `RSCCL_ALGO=ring,tree` where every collective allows
    /// the same, else per collective (`RSCCL_ALGO=Broadcast:ring;…;AllReduce:tree`).
    pub(crate) fn describe(&self) -> String {
        let names = |bits: u16| -> String {
            let n: Vec<&str> = ALGO_NAMES[..ALGO_NAMES.len() - 1]
                .iter()
                .enumerate()
                .filter(|(b, _)| bits & (1 << b) != 0)
                .map(|(_, n)| *n)
                .collect();
            if n.is_empty() {
                "none".into()
            } else {
                n.join(",")
            }
        };
        if self.bits.iter().all(|&b| b == self.bits[0]) {
            return format!("{ALGO_VAR}={}", names(self.bits[0]));
        }
        let per: Vec<String> =
            Coll::ALL.iter().map(|c| format!("{}:{}", c.name(), names(self.of(*c)))).collect();
        format!("{ALGO_VAR}={}", per.join(";"))
    }

    /// [`AlgoMask::describe`] for `coll` alone: `RSCCL_ALGO=tree (for AllReduce)` where the
    /// collectives differ.
    pub(crate) fn describe_for(&self, coll: Collective) -> String {
        let c = Coll::of(coll);
        if self.bits.iter().all(|&b| b == self.bits[0]) {
            return self.describe();
        }
        let one = AlgoMask { bits: [self.of(c); 5], nvls_required: false };
        format!("{} (for {})", one.describe(), c.name())
    }
}

//! The algorithms a communicator may use: `RSCCL_ALGO` (NCCL's `NCCL_ALGO`) as a mask, read
//! once at init; the plan ([`super::Plan`]) chooses among what it allows.
use super::algorithm::Algorithm;
use crate::error::{Error, Result};

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

/// The algorithms `RSCCL_ALGO` allows (NCCL's `NCCL_ALGO`): a comma-separated list of `ring`,
/// `tree`, `nvls`, `nvlstree`, `collnet` (both CollNet forms), `collnetdirect`, `collnetchain`,
/// `pat`, and rsccl's `symll` (the symmetric LL all-reduce) (any case), the ones allowed, or after a `^` the ones excluded; unset or empty: all.
/// MSCCL programs are outside it (as in MSCCL): a registry program serves the calls it names.
///
/// ```
/// use rsccl::comm::AlgoMask;
/// use rsccl::Algorithm;
/// let m = AlgoMask::parse(Some("ring,NVLS"))?;
/// assert!(m.allows(Algorithm::Ring) && m.allows(Algorithm::NvlsSymmetric) && !m.allows(Algorithm::Tree));
/// assert!(!AlgoMask::parse(Some("^tree"))?.allows(Algorithm::Tree));
/// assert!(AlgoMask::parse(None)?.allows(Algorithm::Tree));
/// assert!(AlgoMask::parse(Some("warp")).is_err());
/// # Ok::<(), rsccl::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlgoMask {
    /// One bit per name of [`ALGO_NAMES`].
    bits: u16,
    /// `RSCCL_NVLS_ENABLE=1`: NVLS must come up where the topology serves it.
    nvls_required: bool,
}

/// The names `RSCCL_ALGO` knows, in bit order.
const ALGO_NAMES: [&str; 8] =
    ["ring", "tree", "nvls", "nvlstree", "collnetdirect", "collnetchain", "pat", "symll"];

impl AlgoMask {
    const RING: u16 = 1 << 0;
    const TREE: u16 = 1 << 1;
    const NVLS: u16 = 1 << 2;
    const NVLS_TREE: u16 = 1 << 3;
    const SYM_LL: u16 = 1 << 7;
    const ALL: u16 = (1 << ALGO_NAMES.len()) - 1;

    /// Parses NCCL's syntax (see [`AlgoMask`]); an unknown name is an error naming it.
    pub fn parse(value: Option<&str>) -> Result<AlgoMask> {
        let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(AlgoMask { bits: Self::ALL, nvls_required: false });
        };
        let (exclude, list) = match v.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, v),
        };
        let mut named = 0u16;
        for name in list.split(',').map(|s| s.trim().to_ascii_lowercase()) {
            named |= match name.as_str() {
                "collnet" => 0b11 << 4,
                n => match ALGO_NAMES.iter().position(|&k| k == n) {
                    Some(b) => 1 << b,
                    None => {
                        return Err(Error::InvalidConfig(format!(
                            "{ALGO_VAR}=\"{v}\": unknown algorithm \"{name}\" (ring, tree, nvls, nvlstree, collnetdirect, collnetchain, pat, symll)"
                        )))
                    }
                },
            };
        }
        Ok(AlgoMask { bits: if exclude { Self::ALL & !named } else { named }, nvls_required: false })
    }

    /// Whether `algorithm` may run (the NVLS forms under `nvls`, NVLS_TREE's under either
    /// `nvls` or `nvlstree`; MSCCL and point-to-point always).
    pub fn allows(&self, algorithm: Algorithm) -> bool {
        let bit = match algorithm {
            Algorithm::Ring => Self::RING,
            Algorithm::Tree => Self::TREE,
            Algorithm::Nvls | Algorithm::NvlsSymmetric => Self::NVLS,
            Algorithm::NvlsTree => Self::NVLS | Self::NVLS_TREE,
            Algorithm::SymLl => Self::SYM_LL,
            Algorithm::Msccl(_) | Algorithm::P2p => return true,
        };
        self.bits & bit != 0
    }

    /// What it says about NVLS: only NVLS (forced), NVLS among others (where it applies;
    /// required to come up under `RSCCL_NVLS_ENABLE=1`), or none.
    pub fn nvls_policy(&self) -> NvlsPolicy {
        match (self.bits & Self::NVLS != 0, self.bits & !Self::NVLS != 0) {
            (false, _) => NvlsPolicy::Off,
            (true, false) => NvlsPolicy::Forced,
            (true, true) if self.nvls_required => NvlsPolicy::Required,
            (true, true) => NvlsPolicy::Auto,
        }
    }

    /// This mask under `RSCCL_NVLS_ENABLE` = `level` (`None`: unset, as 2): 0 takes NVLS and
    /// NVLS_TREE out (an error when nothing is left: `RSCCL_ALGO=nvls`), 1 requires NVLS to
    /// come up, 2 leaves it as it is; another value is an error naming the variable.
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
    /// assert!(all.with_nvls_enable(Some(3)).is_err());
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn with_nvls_enable(self, level: Option<u64>) -> Result<AlgoMask> {
        match level {
            None | Some(2) => Ok(self),
            Some(1) => Ok(AlgoMask { nvls_required: true, ..self }),
            Some(0) => {
                let bits = self.bits & !(Self::NVLS | Self::NVLS_TREE);
                if bits & !Self::SYM_LL == 0 && self.bits & !Self::SYM_LL != 0 {
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

    /// The variable's text for messages (`RSCCL_ALGO=...`).
    pub(crate) fn describe(&self) -> String {
        let names: Vec<&str> = ALGO_NAMES
            .iter()
            .enumerate()
            .filter(|(b, _)| self.bits & (1 << b) != 0)
            .map(|(_, n)| *n)
            .collect();
        format!("{ALGO_VAR}={}", names.join(","))
    }
}

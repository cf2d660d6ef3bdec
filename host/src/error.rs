//! The host crate's error type: one line a user can act on, naming what is wrong.
use rsccl_device::prims::conn::ErrorCode;

/// Errors from rsccl's host API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// No CUDA driver could be loaded (the GPU backend is unavailable here).
    NoGpu(String),
    /// A CUDA driver call failed.
    Driver {
        /// The driver call.
        call: &'static str,
        /// The driver's message.
        message: String,
    },
    /// The GPU's architecture has no PTX module in this build.
    UnsupportedArch {
        /// Compute capability major.
        major: i32,
        /// Compute capability minor.
        minor: i32,
    },
    /// No kernel of this name exists.
    UnknownKernel(String),
    /// An embedded library module cannot be read: its packed chunk is damaged.
    CorruptModule {
        /// Its arch (`sm_90`, `sm_80`).
        arch: &'static str,
        /// The kernel whose module was asked for.
        entry: String,
        /// The chunk file it was read from, under `host/ptx/`.
        file: &'static str,
        /// What is wrong with the chunk.
        reason: crate::ptx::pack::PackError,
    },
    /// The launch shape or arguments are not acceptable.
    InvalidLaunch {
        /// Kernel name.
        kernel: String,
        /// What is wrong.
        reason: String,
    },
    /// The kernel failed while running (trap, fault, deadlock detected by the emulator).
    KernelFailed {
        /// Kernel name.
        kernel: String,
        /// What the backend reported.
        detail: String,
    },
    /// The backend could not allocate memory of this size.
    OutOfMemory {
        /// Bytes asked for.
        bytes: usize,
    },
    /// A configuration or call argument is not acceptable.
    InvalidConfig(String),
    /// A collective failed on some ranks' channels (timeouts, aborts).
    Collective {
        /// Every channel that gave up, first the ones that waited for a peer.
        failures: Vec<RankFailure>,
    },
    /// An error on one rank.
    Rank {
        /// The rank.
        rank: usize,
        /// Its error.
        source: Box<Error>,
    },
    /// A topology or graph file (or what was detected on this machine) is not acceptable.
    Topology(crate::topology::TopoError),
    /// A copy or argument touches bytes outside a buffer.
    OutOfRange {
        /// What was being done.
        what: String,
        /// First byte offset touched.
        offset: usize,
        /// Bytes touched.
        bytes: usize,
        /// Size of the buffer.
        len: usize,
    },
    /// Setting up or using the bootstrap network (unique id, root, ranks' sockets) failed.
    Bootstrap(crate::bootstrap::BootstrapError),
    /// The launcher's environment (rank, world size, rendezvous) is missing or not acceptable,
    /// or `rsccl run` could not start its processes.
    Launch(String),
    /// The network transport failed (a socket, an interface, a peer's bytes).
    Network(String),
    /// A collective failed because a network connection to a peer broke (the peer died, closed
    /// the connection or sent what it must not).
    PeerLost {
        /// The rank reporting.
        rank: usize,
        /// The peer at the other end.
        peer: usize,
        /// The peer's host name.
        host: String,
        /// What happened.
        what: String,
        /// The hang report's headline when the communicator could ask the other ranks where
        /// they were (the lost peer may have left because another rank never came).
        report: Option<String>,
    },
    /// A collective timed out and the hang report says who is behind: which ranks never
    /// entered the collective (by its sequence number), which wait in it, which did not answer.
    Hang {
        /// The rank reporting.
        rank: usize,
        /// One line naming who is behind ("rank 5 never entered all_reduce #812; ranks 0–4,
        /// 6–7 wait in it").
        headline: String,
        /// Every rank's state, a line each.
        ranks: Vec<String>,
        /// What this rank's channels reported.
        failures: Vec<RankFailure>,
    },
    /// A point-to-point group timed out: the operations that did not complete and where each
    /// peer they waited for is (its own point-to-point group and collective).
    P2pTimeout {
        /// The rank reporting.
        rank: usize,
        /// The group's number on this rank (1-based; each rank numbers its own groups).
        group: u64,
        /// The operations that did not complete ("receive of 400 bytes from rank 1").
        stuck: Vec<String>,
        /// Each peer waited for, a line each.
        peers: Vec<String>,
        /// What this rank's blocks reported.
        failures: Vec<RankFailure>,
    },
    /// A collective failed because peer processes on this host died.
    PeerDied {
        /// The rank reporting.
        rank: usize,
        /// The ranks whose processes are gone, with their process ids.
        dead: Vec<(usize, u32)>,
        /// What this rank's channels reported.
        failures: Vec<RankFailure>,
    },
    /// Ranks called different collectives, types, ops, counts, roots or algorithms as the same
    /// call (their kernels' signatures differ): the call fails on the ranks that saw it, and the
    /// communicator is refused from then on.
    CallMismatch {
        /// The rank reporting.
        rank: usize,
        /// Its call's number.
        seq: u64,
        /// Its call, as users name it.
        mine: String,
        /// Each peer that differs: its call's number and call where this rank received it
        /// (`None`: the peer refused this rank's call, and its own error names both).
        peers: Vec<(usize, Option<(u64, String)>)>,
    },
    /// A collective failed, or was refused, because ranks of this process left the
    /// communicator (dropped or aborted their `Comm`).
    PeerLeft {
        /// The rank reporting.
        rank: usize,
        /// The ranks that left, each with the failure that ended its call if one did (a rank
        /// that timed out waiting for a third and dropped its `Comm` names that third).
        left: Vec<(usize, Option<String>)>,
    },
    /// A gated collective ([`crate::overlap`]) gave up waiting for a GEMM's tiles.
    TileTimeout {
        /// The rank whose GEMM fell short.
        rank: usize,
        /// The wave group waited for.
        group: usize,
        /// Tiles of that group signalled by then.
        signalled: u64,
        /// Tiles the group holds.
        expected: u64,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::NoGpu(why) => write!(f, "no GPU backend: {why}"),
            Error::Driver { call, message } => write!(f, "CUDA driver call {call} failed: {message}"),
            Error::UnsupportedArch { major, minor } => {
                write!(
                    f,
                    "GPU compute capability {major}.{minor} is not supported (rsccl needs sm_80 or newer)"
                )
            }
            Error::UnknownKernel(name) => write!(f, "unknown kernel `{name}`"),
            Error::CorruptModule { arch, entry, file, reason } => write!(
                f,
                "the embedded {arch} module of `{entry}` cannot be read from host/ptx/{file}: {reason} \
                 (this copy of rsccl is damaged: rebuild it from a clean source)"
            ),
            Error::InvalidLaunch { kernel, reason } => write!(f, "invalid launch of `{kernel}`: {reason}"),
            Error::KernelFailed { kernel, detail } => write!(f, "kernel `{kernel}` failed: {detail}"),
            Error::OutOfMemory { bytes } => write!(f, "out of memory: could not allocate {bytes} bytes"),
            Error::InvalidConfig(why) => write!(f, "invalid configuration: {why}"),
            Error::Collective { failures } => {
                write!(f, "collective failed: ")?;
                for (i, x) in failures.iter().enumerate().take(4) {
                    write!(f, "{}{x}", if i > 0 { "; " } else { "" })?;
                }
                if failures.len() > 4 {
                    write!(f, "; and {} more", failures.len() - 4)?;
                }
                Ok(())
            }
            Error::Rank { rank, source } => write!(f, "rank {rank}: {source}"),
            Error::Topology(e) => write!(f, "topology: {e}"),
            Error::OutOfRange { what, offset, bytes, len } => {
                // Formatting must not overflow where the range itself did.
                write!(f, "{what}: {bytes} bytes at offset {offset} are outside the buffer of {len} bytes")
            }
            Error::Bootstrap(e) => write!(f, "bootstrap: {e}"),
            Error::Launch(why) => write!(f, "launch: {why}"),
            Error::Network(why) => write!(f, "network: {why}"),
            Error::Hang { rank, headline, ranks, failures } => {
                write!(f, "rank {rank}: collective timed out: {headline}")?;
                if let Some(x) = failures.first() {
                    write!(f, " ({x})")?;
                }
                for l in ranks {
                    write!(f, "\n  {l}")?;
                }
                Ok(())
            }
            Error::P2pTimeout { rank, group, stuck, peers, failures } => {
                write!(
                    f,
                    "rank {rank}: point-to-point group #{group} timed out: {} did not complete",
                    stuck.join("; ")
                )?;
                if let Some(x) = failures.first() {
                    write!(f, " ({x})")?;
                }
                for l in peers {
                    write!(f, "\n  {l}")?;
                }
                Ok(())
            }
            Error::PeerLost { rank, peer, host, what, report } => {
                write!(
                    f,
                    "rank {rank}: collective failed: connection to rank {peer} on {host} lost: {what}"
                )?;
                if let Some(r) = report {
                    write!(f, "; the ranks say: {r}")?;
                }
                Ok(())
            }
            Error::PeerDied { rank, dead, failures } => {
                write!(f, "rank {rank}: collective failed: ")?;
                for (i, (r, pid)) in dead.iter().enumerate() {
                    write!(f, "{}rank {r} (pid {pid})", if i > 0 { ", " } else { "" })?;
                }
                write!(f, " died")?;
                if let Some(x) = failures.first() {
                    write!(f, " ({x})")?;
                }
                Ok(())
            }
            Error::CallMismatch { rank, seq, mine, peers } => {
                write!(f, "rank {rank}: calls do not match across ranks: ")?;
                for (i, (p, theirs)) in peers.iter().enumerate() {
                    write!(f, "{}", if i > 0 { "; " } else { "" })?;
                    match theirs {
                        Some((s, t)) if s == seq => {
                            write!(f, "rank {p} called {t} where rank {rank} called {mine} as call #{seq}")?
                        }
                        Some((s, t)) => write!(
                            f,
                            "rank {p} was at call #{s}, {t}, where rank {rank} called {mine} as call #{seq}"
                        )?,
                        None => {
                            write!(f, "rank {p} refused rank {rank}'s call #{seq}, {mine}, as not its own")?
                        }
                    }
                }
                write!(f, " (the communicator cannot be used any more)")
            }
            Error::TileTimeout { rank, group, signalled, expected } => write!(
                f,
                "rank {rank}: timed out waiting for the GEMM's tiles of wave group {group}: {signalled} of \
                 {expected} signalled (a kernel that writes the output must signal every tile)"
            ),
            Error::PeerLeft { rank, left } => {
                let names: Vec<String> = left.iter().map(|(r, _)| format!("rank {r}")).collect();
                write!(
                    f,
                    "rank {rank}: {} left the communicator (dropped or aborted its Comm)",
                    names.join(", ")
                )?;
                for (r, why) in left {
                    if let Some(why) = why {
                        write!(f, "; rank {r} left after its call failed: {why}")?;
                    }
                }
                write!(f, "; create a new one")
            }
        }
    }
}

impl std::error::Error for Error {}

impl From<crate::bootstrap::BootstrapError> for Error {
    fn from(e: crate::bootstrap::BootstrapError) -> Self {
        Error::Bootstrap(e)
    }
}

/// A rank's channel that gave up waiting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankFailure {
    /// The rank that gave up.
    pub rank: usize,
    /// Its channel.
    pub channel: usize,
    /// Why.
    pub code: ErrorCode,
    /// The peer it was waiting for.
    pub peer: usize,
    /// The FIFO step it was waiting at.
    pub step: u64,
}

impl std::fmt::Display for RankFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.code {
            ErrorCode::RecvTimeout => format!("timed out waiting for data from rank {}", self.peer),
            ErrorCode::SendTimeout => format!("timed out waiting for rank {} to free a FIFO slot", self.peer),
            ErrorCode::Aborted => "aborted by the host".to_string(),
            ErrorCode::Race => "a write race on symmetric memory".to_string(),
            ErrorCode::DependencyTimeout => {
                format!("timed out waiting for threadblock {} of this rank (an MSCCL dependency)", self.peer)
            }
            ErrorCode::Mismatch => format!("rank {}'s call does not match this rank's", self.peer),
            ErrorCode::TileTimeout => {
                return write!(
                f,
                "rank {} channel {}: timed out waiting for the GEMM's tiles of wave group {} ({} signalled)",
                self.rank, self.channel, self.peer, self.step
            )
            }
            ErrorCode::None => "no error".to_string(),
        };
        write!(f, "rank {} channel {}: {what} (step {})", self.rank, self.channel, self.step)
    }
}

impl From<crate::topology::TopoError> for Error {
    fn from(e: crate::topology::TopoError) -> Self {
        Error::Topology(e)
    }
}

/// Result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

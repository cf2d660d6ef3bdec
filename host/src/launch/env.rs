//! Which rank this process is, read from the variables a launcher sets.
//!
//! Each launcher has its own names; [`LaunchEnv::from_vars`] knows four conventions and picks
//! one by [`Launcher::PRECEDENCE`]. The reading is a pure function of a variable lookup so the
//! conventions can be tested without touching the process environment.
use crate::error::{Error, Result};

/// The largest world size accepted from a launcher's variables (and by `rsccl run -n`).
///
/// A world size above it is far more likely a garbled variable than a real job; a limit also
/// bounds what the bootstrap allocates per rank before any peer has connected.
pub const MAX_WORLD_SIZE: usize = 65536;

/// Variable naming the rendezvous as `host:port` (as `NCCL_COMM_ID` does for NCCL); it takes
/// precedence over `MASTER_ADDR` / `MASTER_PORT`.
pub const COMM_ID_VAR: &str = "RSCCL_COMM_ID";

/// The launcher whose variables gave a [`LaunchEnv`] its rank and world size.
///
/// ```
/// use rsccl::launch::Launcher;
///
/// assert_eq!(Launcher::OpenMpi.rank_var(), "OMPI_COMM_WORLD_RANK");
/// assert_eq!(Launcher::PRECEDENCE[0], Launcher::Torchrun);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Launcher {
    /// torchrun's convention (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`), which
    /// `rsccl run` also follows.
    Torchrun,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`,
    /// `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_SIZE`).
    OpenMpi,
    /// A PMI process manager: MPICH's Hydra, Intel MPI, `srun --mpi=pmi2` (`PMI_RANK`,
    /// `PMI_SIZE`; Hydra adds `MPI_LOCALRANKID`, `MPI_LOCALNRANKS`).
    Pmi,
    /// Slurm's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`; the local size from
    /// `SLURM_TASKS_PER_NODE` or `SLURM_NTASKS_PER_NODE`).
    Slurm,
}

impl Launcher {
    /// The order in which launchers' variables are tried; the first whose rank variable is set
    /// is used, the others are ignored.
    ///
    /// torchrun's `RANK` comes first because it is the most specific: it is set for exactly
    /// this process (by torchrun or `rsccl run`), possibly inside an MPI or Slurm job whose
    /// variables the processes inherited. Open MPI and PMI come before Slurm because `mpirun`
    /// or `mpiexec` run inside a Slurm allocation leave Slurm's variables describing the
    /// allocation's step (the daemons), not the MPI ranks; where `srun` itself provides PMI,
    /// the two agree.
    pub const PRECEDENCE: [Launcher; 4] =
        [Launcher::Torchrun, Launcher::OpenMpi, Launcher::Pmi, Launcher::Slurm];

    /// A short human name, as used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Torchrun => "torchrun / rsccl run",
            Launcher::OpenMpi => "Open MPI",
            Launcher::Pmi => "PMI (MPICH, Intel MPI)",
            Launcher::Slurm => "Slurm",
        }
    }

    /// The variable holding this process's rank; its presence selects the launcher.
    pub fn rank_var(self) -> &'static str {
        match self {
            Launcher::Torchrun => "RANK",
            Launcher::OpenMpi => "OMPI_COMM_WORLD_RANK",
            Launcher::Pmi => "PMI_RANK",
            Launcher::Slurm => "SLURM_PROCID",
        }
    }

    /// The variable holding the number of ranks.
    pub fn size_var(self) -> &'static str {
        match self {
            Launcher::Torchrun => "WORLD_SIZE",
            Launcher::OpenMpi => "OMPI_COMM_WORLD_SIZE",
            Launcher::Pmi => "PMI_SIZE",
            Launcher::Slurm => "SLURM_NTASKS",
        }
    }

    /// The variable holding the rank among the processes on this node, where there is one.
    pub fn local_rank_var(self) -> &'static str {
        match self {
            Launcher::Torchrun => "LOCAL_RANK",
            Launcher::OpenMpi => "OMPI_COMM_WORLD_LOCAL_RANK",
            Launcher::Pmi => "MPI_LOCALRANKID",
            Launcher::Slurm => "SLURM_LOCALID",
        }
    }

    /// The variable holding the number of processes on this node. Slurm's is not a plain
    /// number (`4(x2),3`, see [`LaunchEnv::from_vars`]); this names the one read first.
    pub fn local_size_var(self) -> &'static str {
        match self {
            Launcher::Torchrun => "LOCAL_WORLD_SIZE",
            Launcher::OpenMpi => "OMPI_COMM_WORLD_LOCAL_SIZE",
            Launcher::Pmi => "MPI_LOCALNRANKS",
            Launcher::Slurm => "SLURM_TASKS_PER_NODE",
        }
    }
}

impl std::fmt::Display for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// This process's place in a multi-process job, as its launcher described it.
///
/// ```
/// use rsccl::launch::{LaunchEnv, Launcher};
///
/// let vars = [("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_SIZE", "8"),
///             ("OMPI_COMM_WORLD_LOCAL_RANK", "1"), ("MASTER_ADDR", "fe80::1"),
///             ("MASTER_PORT", "29500")];
/// let env = LaunchEnv::from_vars(|name| {
///     vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
/// })?;
/// assert_eq!((env.rank, env.world_size, env.launcher), (3, 8, Launcher::OpenMpi));
/// assert_eq!((env.local_rank, env.local_world_size), (Some(1), None));
/// assert_eq!(env.rendezvous.as_deref(), Some("[fe80::1]:29500"));
/// # Ok::<(), rsccl::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// This process's rank, below `world_size`.
    pub rank: usize,
    /// The number of ranks, 1 to [`MAX_WORLD_SIZE`].
    pub world_size: usize,
    /// The rank among the processes on this node (usually the GPU to use), if the launcher
    /// says.
    pub local_rank: Option<usize>,
    /// The number of processes on this node, if the launcher says.
    pub local_world_size: Option<usize>,
    /// Where the ranks meet, as `host:port` with an IPv6 host in brackets (so it resolves with
    /// [`std::net::ToSocketAddrs`]): `RSCCL_COMM_ID` if set, else `MASTER_ADDR:MASTER_PORT`,
    /// else `None` (the application must then pass a unique id itself).
    pub rendezvous: Option<String>,
    /// Whose variables were read.
    pub launcher: Launcher,
}

impl LaunchEnv {
    /// Reads the process environment; see [`LaunchEnv::from_vars`]. A value that is not UTF-8
    /// is read lossily, so it is reported as garbage rather than taken as unset.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Reads the launcher variables through `var` (a variable's value, `None` when unset).
    ///
    /// The launcher is the first of [`Launcher::PRECEDENCE`] whose rank variable is set; its
    /// world size variable must then be set too, and the local rank and size are read from the
    /// same launcher's variables only. Numbers are plain decimal digits. Slurm's tasks per node
    /// (`SLURM_TASKS_PER_NODE`, else `SLURM_NTASKS_PER_NODE`) may look like `4(x2),3`: the
    /// count of this node (`SLURM_NODEID`) is used where the list gives one, and a value that
    /// cannot be read leaves `local_world_size` unset rather than failing, as it is only a
    /// hint. The rendezvous is `RSCCL_COMM_ID` (`host:port`, an IPv6 host in brackets) when
    /// set, in which case `MASTER_ADDR` / `MASTER_PORT` are not read; else both of these or
    /// neither.
    ///
    /// Errors ([`Error::Launch`]): no launcher's rank variable set (the message names every
    /// variable looked for), a rank without its world size, a value that is not a number, a
    /// rank not below the world size, a world size of 0 or above [`MAX_WORLD_SIZE`], a local
    /// rank or size that contradicts the others, a half-set or malformed rendezvous.
    ///
    /// ```
    /// use rsccl::launch::LaunchEnv;
    ///
    /// let env = LaunchEnv::from_vars(|name| match name {
    ///     "SLURM_PROCID" => Some("5".into()),
    ///     "SLURM_NTASKS" => Some("8".into()),
    ///     "SLURM_LOCALID" => Some("1".into()),
    ///     "SLURM_TASKS_PER_NODE" => Some("4(x2)".into()),
    ///     "RSCCL_COMM_ID" => Some("node0:29500".into()),
    ///     _ => None,
    /// })?;
    /// assert_eq!((env.rank, env.local_rank, env.local_world_size), (5, Some(1), Some(4)));
    /// assert_eq!(env.rendezvous.as_deref(), Some("node0:29500"));
    ///
    /// let err = LaunchEnv::from_vars(|_| None).unwrap_err().to_string();
    /// assert!(err.contains("OMPI_COMM_WORLD_RANK") && err.contains("SLURM_NTASKS"), "{err}");
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn from_vars(mut var: impl FnMut(&str) -> Option<String>) -> Result<Self> {
        let Some((launcher, rank_text)) =
            Launcher::PRECEDENCE.iter().find_map(|&l| var(l.rank_var()).map(|v| (l, v)))
        else {
            return Err(none_set_error());
        };
        let (rank_var, size_var) = (launcher.rank_var(), launcher.size_var());
        let rank = number(rank_var, &rank_text)?;
        let Some(size_text) = var(size_var) else {
            return Err(launch_error(format!(
                "{rank_var}={rank_text} is set but {size_var} is not ({} variables)",
                launcher.name()
            )));
        };
        let world_size = number(size_var, &size_text)?;
        if world_size == 0 {
            return Err(launch_error(format!("{size_var}=0: the world size must be at least 1")));
        }
        if world_size > MAX_WORLD_SIZE {
            return Err(launch_error(format!(
                "{size_var}={world_size} is above the limit of {MAX_WORLD_SIZE} ranks"
            )));
        }
        if rank >= world_size {
            return Err(launch_error(format!("{rank_var}={rank} is not below {size_var}={world_size}")));
        }

        let local_rank_var = launcher.local_rank_var();
        let local_rank = var(local_rank_var).map(|v| number(local_rank_var, &v)).transpose()?;
        let local_world_size = match launcher {
            Launcher::Slurm => slurm_local_size(&mut var, local_rank, world_size),
            _ => {
                let name = launcher.local_size_var();
                match var(name).map(|v| number(name, &v)).transpose()? {
                    Some(0) => return Err(launch_error(format!("{name}=0: a node has at least one rank"))),
                    Some(n) if n > world_size => {
                        return Err(launch_error(format!("{name}={n} is above {size_var}={world_size}")))
                    }
                    n => n,
                }
            }
        };
        match (local_rank, local_world_size) {
            (Some(r), Some(n)) if r >= n => {
                return Err(launch_error(format!(
                    "{local_rank_var}={r} is not below the {n} ranks on this node ({})",
                    launcher.local_size_var()
                )))
            }
            (Some(r), _) if r >= world_size => {
                return Err(launch_error(format!(
                    "{local_rank_var}={r} is not below {size_var}={world_size}"
                )))
            }
            _ => {}
        }

        let rendezvous = rendezvous(&mut var)?;
        Ok(LaunchEnv { rank, world_size, local_rank, local_world_size, rendezvous, launcher })
    }
}

fn launch_error(why: String) -> Error {
    Error::Launch(why)
}

fn none_set_error() -> Error {
    let looked: Vec<String> = Launcher::PRECEDENCE
        .iter()
        .map(|l| format!("{} and {} ({})", l.rank_var(), l.size_var(), l.name()))
        .collect();
    launch_error(format!(
        "no launcher's rank is set: looked for {}; start the processes with `rsccl run -n N`, \
         torchrun, mpirun or srun",
        looked.join(", ")
    ))
}

/// A plain decimal number: no sign, no spaces, so a garbled value is an error rather than a
/// silently different rank.
fn number(name: &str, value: &str) -> Result<usize> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(launch_error(format!("{name}={value:?} is not a non-negative integer")));
    }
    value.parse().map_err(|_| launch_error(format!("{name}={value} is too large")))
}

/// Slurm's tasks per node, best effort: the value is only a hint, and its format (`2(x3),1`)
/// has varied between versions, so what cannot be read is left out instead of failing a job
/// whose ranks are fine.
fn slurm_local_size(
    var: &mut impl FnMut(&str) -> Option<String>,
    local_rank: Option<usize>,
    world_size: usize,
) -> Option<usize> {
    let node = var("SLURM_NODEID").and_then(|v| v.parse::<usize>().ok());
    // SLURM_TASKS_PER_NODE is how the tasks were placed; SLURM_NTASKS_PER_NODE only what was
    // asked for (set only with --ntasks-per-node), so the former is read first.
    ["SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"]
        .iter()
        .find_map(|name| var(name).and_then(|v| tasks_on_node(&v, node)))
        .filter(|&n| n >= 1 && n <= world_size && local_rank.is_none_or(|r| r < n))
}

/// The count for node `node` in Slurm's compressed list (`4(x2),3` = 4, 4, 3), or the count
/// every node has when they agree. `None` when the list cannot be read or does not say.
fn tasks_on_node(list: &str, node: Option<usize>) -> Option<usize> {
    let mut groups = Vec::new();
    for item in list.split(',') {
        let (count, repeat) = match item.split_once('(') {
            None => (item, "1"),
            Some((count, rest)) => (count, rest.strip_prefix('x')?.strip_suffix(')')?),
        };
        let count: usize = count.trim().parse().ok()?;
        let repeat: usize = repeat.trim().parse().ok()?;
        if repeat == 0 {
            return None;
        }
        groups.push((count, repeat));
    }
    if let Some(&(first, _)) = groups.first() {
        if groups.iter().all(|&(c, _)| c == first) {
            return Some(first);
        }
    }
    // Walk the groups rather than expanding them: a repeat count could be huge.
    let mut node = node?;
    for (count, repeat) in groups {
        if node < repeat {
            return Some(count);
        }
        node -= repeat;
    }
    None
}

fn rendezvous(var: &mut impl FnMut(&str) -> Option<String>) -> Result<Option<String>> {
    if let Some(id) = var(COMM_ID_VAR) {
        return comm_id(&id).map(Some);
    }
    match (var("MASTER_ADDR"), var("MASTER_PORT")) {
        (None, None) => Ok(None),
        (Some(addr), None) => Err(launch_error(format!(
            "MASTER_ADDR={addr} is set but MASTER_PORT is not; set both, or {COMM_ID_VAR}=host:port"
        ))),
        (None, Some(port)) => Err(launch_error(format!(
            "MASTER_PORT={port} is set but MASTER_ADDR is not; set both, or {COMM_ID_VAR}=host:port"
        ))),
        (Some(addr), Some(port)) => {
            let port = port_number("MASTER_PORT", &port)?;
            if addr.is_empty() || addr.contains(char::is_whitespace) {
                return Err(launch_error(format!("MASTER_ADDR={addr:?} is not a host name or address")));
            }
            // An IPv6 address needs brackets in host:port, or its last group reads as the port.
            if addr.contains(':') && !addr.starts_with('[') {
                Ok(Some(format!("[{addr}]:{port}")))
            } else {
                Ok(Some(format!("{addr}:{port}")))
            }
        }
    }
}

/// `RSCCL_COMM_ID`: `host:port`, where a host with colons (IPv6) must be bracketed so that the
/// port is unambiguous.
fn comm_id(id: &str) -> Result<String> {
    match split_host_port(id) {
        Ok(_) => Ok(id.to_string()),
        Err(why) => Err(launch_error(format!("{COMM_ID_VAR}={id:?} is not host:port ({why})"))),
    }
}

/// `host:port` (an IPv6 host in brackets, `[::1]:29500`) split into the host, without its
/// brackets, and the port; otherwise why not, in a few words. Used for `RSCCL_COMM_ID` and
/// `rsccl run --master`.
pub(super) fn split_host_port(addr: &str) -> std::result::Result<(&str, u16), String> {
    let (host, port) = addr.rsplit_once(':').ok_or("no port")?;
    let inner = match host.strip_prefix('[') {
        Some(rest) => rest.strip_suffix(']').ok_or("unclosed bracket")?,
        None if host.contains(':') => return Err("an IPv6 host must be in brackets, as [::1]:port".into()),
        None => host,
    };
    if inner.is_empty() || inner.contains(char::is_whitespace) || inner.contains(['[', ']']) {
        return Err("no host".into());
    }
    match number("port", port) {
        Ok(p @ 1..=65535) => Ok((inner, p as u16)),
        _ => Err(format!("{port:?} is not a port number (1 to 65535)")),
    }
}

fn port_number(name: &str, value: &str) -> Result<u16> {
    match number(name, value) {
        Ok(p @ 1..=65535) => Ok(p as u16),
        _ => Err(launch_error(format!("{name}: {value:?} is not a port number (1 to 65535)"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Result<LaunchEnv> {
        LaunchEnv::from_vars(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()))
    }

    fn err(vars: &[(&str, &str)]) -> String {
        match env(vars) {
            Err(Error::Launch(why)) => why,
            other => panic!("{vars:?}: expected a launch error, got {other:?}"),
        }
    }

    #[test]
    fn torchrun() {
        let e = env(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert_eq!(
            e,
            LaunchEnv {
                rank: 2,
                world_size: 4,
                local_rank: Some(0),
                local_world_size: Some(2),
                rendezvous: Some("10.1.2.3:29500".into()),
                launcher: Launcher::Torchrun,
            }
        );
    }

    #[test]
    fn open_mpi() {
        let e = env(&[
            ("OMPI_COMM_WORLD_RANK", "7"),
            ("OMPI_COMM_WORLD_SIZE", "16"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "8"),
        ])
        .unwrap();
        assert_eq!((e.rank, e.world_size, e.local_rank, e.local_world_size), (7, 16, Some(3), Some(8)));
        assert_eq!((e.launcher, e.rendezvous), (Launcher::OpenMpi, None));
    }

    #[test]
    fn pmi_with_and_without_hydra_locals() {
        let e =
            env(&[("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("MPI_LOCALRANKID", "1"), ("MPI_LOCALNRANKS", "2")])
                .unwrap();
        assert_eq!(
            (e.launcher, e.rank, e.world_size, e.local_rank, e.local_world_size),
            (Launcher::Pmi, 1, 2, Some(1), Some(2))
        );
        let e = env(&[("PMI_RANK", "0"), ("PMI_SIZE", "1")]).unwrap();
        assert_eq!((e.local_rank, e.local_world_size), (None, None));
    }

    #[test]
    fn slurm_and_its_tasks_per_node_formats() {
        let base = [("SLURM_PROCID", "5"), ("SLURM_NTASKS", "11"), ("SLURM_LOCALID", "1")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            env(&v).unwrap()
        };
        let e = with(&[("SLURM_NTASKS_PER_NODE", "4")]);
        assert_eq!((e.launcher, e.rank, e.world_size, e.local_rank), (Launcher::Slurm, 5, 11, Some(1)));
        assert_eq!(e.local_world_size, Some(4));
        assert_eq!(with(&[("SLURM_NTASKS_PER_NODE", "4(x2)")]).local_world_size, Some(4));
        // Uneven placement: this node's entry, found by SLURM_NODEID.
        let uneven = [("SLURM_TASKS_PER_NODE", "4(x2),3"), ("SLURM_NODEID", "2")];
        assert_eq!(with(&uneven).local_world_size, Some(3));
        assert_eq!(
            with(&[("SLURM_TASKS_PER_NODE", "4(x2),3"), ("SLURM_NODEID", "1")]).local_world_size,
            Some(4)
        );
        // The placement is read before the request.
        assert_eq!(
            with(&[("SLURM_TASKS_PER_NODE", "3"), ("SLURM_NTASKS_PER_NODE", "4")]).local_world_size,
            Some(3)
        );
        // What cannot be read, or does not say for this node, is left out, not an error.
        for bad in ["4(x", "x4", "4(y2)", "", "4(x0)", "-1", "2(x1),1", "1(x99999999999999999999)"] {
            assert_eq!(with(&[("SLURM_NTASKS_PER_NODE", bad)]).local_world_size, None, "{bad}");
        }
        assert_eq!(
            with(&[("SLURM_TASKS_PER_NODE", "4(x2),3"), ("SLURM_NODEID", "9")]).local_world_size,
            None
        );
        // A count contradicting SLURM_LOCALID or the world is dropped too.
        assert_eq!(with(&[("SLURM_NTASKS_PER_NODE", "1")]).local_world_size, None);
        assert_eq!(with(&[("SLURM_NTASKS_PER_NODE", "12")]).local_world_size, None);
    }

    #[test]
    fn precedence_is_torchrun_open_mpi_pmi_slurm() {
        let all = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
        ];
        for (skip, want) in
            [(0, Launcher::Torchrun), (2, Launcher::OpenMpi), (4, Launcher::Pmi), (6, Launcher::Slurm)]
        {
            let vars: Vec<_> = all.iter().rev().skip(skip).copied().collect();
            let e = env(&vars).unwrap();
            assert_eq!(e.launcher, want);
            assert_eq!(e.rank, 3 - skip / 2);
        }
        // Local variables come from the chosen launcher only.
        let e = env(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_LOCAL_RANK", "1")]).unwrap();
        assert_eq!(e.local_rank, None);
    }

    #[test]
    fn nothing_set_names_every_variable() {
        let why = err(&[]);
        for l in Launcher::PRECEDENCE {
            assert!(why.contains(l.rank_var()) && why.contains(l.size_var()), "{why}");
        }
        // A world size alone does not select a launcher.
        assert!(err(&[("WORLD_SIZE", "4")]).starts_with("no launcher's rank is set"));
    }

    #[test]
    fn rank_without_world_size() {
        assert_eq!(
            err(&[("RANK", "1")]),
            "RANK=1 is set but WORLD_SIZE is not (torchrun / rsccl run variables)"
        );
        assert!(err(&[("SLURM_PROCID", "1")]).contains("SLURM_NTASKS is not"));
    }

    #[test]
    fn garbage_numbers_name_the_variable_and_value() {
        for (vars, want) in [
            (&[("RANK", "one"), ("WORLD_SIZE", "2")][..], "RANK=\"one\" is not a non-negative integer"),
            (&[("RANK", "0"), ("WORLD_SIZE", "-2")], "WORLD_SIZE=\"-2\""),
            (&[("RANK", "0"), ("WORLD_SIZE", " 2")], "WORLD_SIZE=\" 2\""),
            (&[("RANK", ""), ("WORLD_SIZE", "2")], "RANK=\"\""),
            (&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0x1")], "LOCAL_RANK=\"0x1\""),
            (&[("PMI_RANK", "0"), ("PMI_SIZE", "2"), ("MPI_LOCALNRANKS", "two")], "MPI_LOCALNRANKS=\"two\""),
            (
                &[("RANK", "99999999999999999999999"), ("WORLD_SIZE", "2")],
                "RANK=99999999999999999999999 is too large",
            ),
        ] {
            let why = err(vars);
            assert!(why.contains(want), "{vars:?}: {why}");
        }
    }

    #[test]
    fn rank_must_be_below_world_size() {
        assert_eq!(err(&[("RANK", "4"), ("WORLD_SIZE", "4")]), "RANK=4 is not below WORLD_SIZE=4");
        assert_eq!(
            err(&[("OMPI_COMM_WORLD_RANK", "9"), ("OMPI_COMM_WORLD_SIZE", "2")]),
            "OMPI_COMM_WORLD_RANK=9 is not below OMPI_COMM_WORLD_SIZE=2"
        );
    }

    #[test]
    fn world_size_zero_or_above_the_limit() {
        assert_eq!(
            err(&[("RANK", "0"), ("WORLD_SIZE", "0")]),
            "WORLD_SIZE=0: the world size must be at least 1"
        );
        let over = (MAX_WORLD_SIZE + 1).to_string();
        assert_eq!(
            err(&[("RANK", "0"), ("WORLD_SIZE", &over)]),
            format!("WORLD_SIZE={over} is above the limit of {MAX_WORLD_SIZE} ranks")
        );
        let max = MAX_WORLD_SIZE.to_string();
        assert_eq!(env(&[("RANK", "65535"), ("WORLD_SIZE", &max)]).unwrap().world_size, MAX_WORLD_SIZE);
    }

    #[test]
    fn local_rank_and_size_must_agree() {
        let base = [("RANK", "0"), ("WORLD_SIZE", "4")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            err(&v)
        };
        assert!(with(&[("LOCAL_RANK", "2"), ("LOCAL_WORLD_SIZE", "2")])
            .contains("LOCAL_RANK=2 is not below the 2 ranks"));
        assert_eq!(with(&[("LOCAL_RANK", "4")]), "LOCAL_RANK=4 is not below WORLD_SIZE=4");
        assert_eq!(with(&[("LOCAL_WORLD_SIZE", "0")]), "LOCAL_WORLD_SIZE=0: a node has at least one rank");
        assert_eq!(with(&[("LOCAL_WORLD_SIZE", "5")]), "LOCAL_WORLD_SIZE=5 is above WORLD_SIZE=4");
    }

    #[test]
    fn rendezvous_sources_and_precedence() {
        let base = [("RANK", "0"), ("WORLD_SIZE", "1")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            env(&v).map(|e| e.rendezvous)
        };
        assert_eq!(with(&[]).unwrap(), None);
        assert_eq!(
            with(&[("MASTER_ADDR", "node-7"), ("MASTER_PORT", "1234")]).unwrap().unwrap(),
            "node-7:1234"
        );
        assert_eq!(with(&[("MASTER_ADDR", "::1"), ("MASTER_PORT", "1234")]).unwrap().unwrap(), "[::1]:1234");
        assert_eq!(
            with(&[("MASTER_ADDR", "[::1]"), ("MASTER_PORT", "1234")]).unwrap().unwrap(),
            "[::1]:1234"
        );
        // RSCCL_COMM_ID wins, and then a half-set MASTER_* pair is not looked at.
        let both = [("RSCCL_COMM_ID", "10.0.0.1:5000"), ("MASTER_ADDR", "10.0.0.2")];
        assert_eq!(with(&both).unwrap().unwrap(), "10.0.0.1:5000");
        assert_eq!(with(&[("RSCCL_COMM_ID", "[fe80::2]:5000")]).unwrap().unwrap(), "[fe80::2]:5000");
        // What it gives resolves as a socket address.
        use std::net::ToSocketAddrs;
        let r = with(&[("MASTER_ADDR", "::1"), ("MASTER_PORT", "1234")]).unwrap().unwrap();
        assert_eq!(r.to_socket_addrs().unwrap().next().unwrap().port(), 1234);
    }

    #[test]
    fn bad_rendezvous() {
        let base = [("RANK", "0"), ("WORLD_SIZE", "1")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            err(&v)
        };
        assert_eq!(
            with(&[("MASTER_ADDR", "10.0.0.1")]),
            "MASTER_ADDR=10.0.0.1 is set but MASTER_PORT is not; set both, or RSCCL_COMM_ID=host:port"
        );
        assert!(
            with(&[("MASTER_PORT", "29500")]).starts_with("MASTER_PORT=29500 is set but MASTER_ADDR is not")
        );
        for port in ["0", "65536", "http", ""] {
            let why = with(&[("MASTER_ADDR", "h"), ("MASTER_PORT", port)]);
            assert!(why.contains(&format!("MASTER_PORT: {port:?} is not a port number")), "{why}");
        }
        assert!(with(&[("MASTER_ADDR", ""), ("MASTER_PORT", "1")]).contains("MASTER_ADDR=\"\""));
        for (id, why) in [
            ("node0", "no port"),
            ("node0:", "not a port number"),
            (":29500", "no host"),
            ("::1:29500", "in brackets"),
            ("[::1:29500", "unclosed bracket"),
            ("[]:29500", "no host"),
            ("node0:99999", "not a port number"),
            ("[[::1]]:29500", "no host"),
        ] {
            let got = with(&[("RSCCL_COMM_ID", id)]);
            assert!(got.contains(why) && got.contains("RSCCL_COMM_ID"), "{id}: {got}");
        }
    }

    #[test]
    fn host_port_splits() {
        assert_eq!(split_host_port("127.0.0.1:29500"), Ok(("127.0.0.1", 29500)));
        assert_eq!(split_host_port("node-0.cluster:1"), Ok(("node-0.cluster", 1)));
        assert_eq!(split_host_port("[::1]:65535"), Ok(("::1", 65535)));
        for (addr, why) in [
            ("node0", "no port"),
            ("node0:0", "\"0\" is not a port number (1 to 65535)"),
            ("node0:+80", "is not a port number"),
            (":80", "no host"),
            ("a b:80", "no host"),
            ("::1:80", "in brackets"),
            ("[::1:80", "unclosed bracket"),
        ] {
            let got = split_host_port(addr).unwrap_err();
            assert!(got.contains(why), "{addr}: {got}");
        }
    }

    #[test]
    fn errors_display_as_launch_errors() {
        let e = env(&[("RANK", "1"), ("WORLD_SIZE", "1")]).unwrap_err();
        assert_eq!(e.to_string(), "launch: RANK=1 is not below WORLD_SIZE=1");
    }
}

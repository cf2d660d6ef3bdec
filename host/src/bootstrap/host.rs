//! This host's identity, as NCCL's `getHostHash`: the host name and the kernel's boot id, so that
//! two containers on one machine with the same name but another boot id count as one host only
//! when they really share the kernel. `RSCCL_HOSTID` overrides both (as `NCCL_HOSTID`).
use super::wire::MAX_HOSTNAME;

/// Whether process `pid` is alive (not gone, not a zombie).
pub(crate) fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 checks existence and permission only; nothing is sent.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    // /proc/PID/stat: "pid (comm) S ..."; the state follows the last ')'.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z') | Some('X'))
}

/// Who this host is.
#[derive(Debug, Clone)]
pub(crate) struct HostId {
    /// Hash of the host name and boot id (or of `RSCCL_HOSTID`).
    pub hash: u64,
    /// The host name, for messages.
    pub name: String,
}

fn read_trimmed(path: &str) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// This host's identity, or the one `host_id` names (as `RSCCL_HOSTID` would).
pub(crate) fn identity_as(host_id: Option<&str>) -> HostId {
    match host_id.filter(|h| !h.is_empty()) {
        Some(id) => {
            let name = identity().name;
            HostId { hash: fnv1a64(FNV_OFFSET, id.as_bytes()), name }
        }
        None => identity(),
    }
}

/// A host identity that replaces the machine's own (NCCL's `NCCL_HOSTID`): processes of one
/// machine can play several nodes.
pub const HOSTID_VAR: &str = "RSCCL_HOSTID";

/// This host's identity.
pub(crate) fn identity() -> HostId {
    let name = read_trimmed("/proc/sys/kernel/hostname")
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "localhost".to_string());
    let name = truncate(name, MAX_HOSTNAME);
    if let Some(id) = std::env::var(HOSTID_VAR).ok().filter(|h| !h.is_empty()) {
        return HostId { hash: fnv1a64(FNV_OFFSET, id.as_bytes()), name };
    }
    let boot = read_trimmed("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let mut h = fnv1a64(FNV_OFFSET, name.as_bytes());
    h = fnv1a64(h, b"\0");
    h = fnv1a64(h, boot.as_bytes());
    HostId { hash: h, name }
}

/// `s` cut to at most `max` bytes, at a character boundary.
pub(crate) fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// The FNV-1a 64-bit offset basis.
pub(crate) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a over `bytes`, continuing from `h`. Not cryptographic.
pub(crate) fn fnv1a64(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// SplitMix64's finalizer: spreads every input bit over the output.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_stable_and_named() {
        let (a, b) = (identity(), identity());
        assert_eq!(a.hash, b.hash);
        assert!(!a.name.is_empty() && a.name.len() <= MAX_HOSTNAME);
        assert_eq!(truncate("héllo".into(), 2), "h");
        assert_ne!(fnv1a64(FNV_OFFSET, b"a"), fnv1a64(FNV_OFFSET, b"b"));
    }
}

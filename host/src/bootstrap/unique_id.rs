//! [`UniqueId`]: where the root listens and the secret every bootstrap connection presents.
use super::error::BootstrapError;
use super::host::{fnv1a64, mix64, FNV_OFFSET};
use super::root;
use super::secret::random_secret;
use super::secret::Secret;
use super::wire::{decode_addr, encode_addr, ADDR_LEN};
use crate::Result;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs, UdpSocket};
use std::str::FromStr;
use std::time::Duration;

/// How long a root started by [`UniqueId::new`], [`UniqueId::with_addr`] or
/// [`UniqueId::from_rendezvous`] waits for all ranks before it gives up and exits.
pub const DEFAULT_ROOT_TIMEOUT: Duration = Duration::from_secs(300);

/// The environment variable naming the rendezvous address for [`UniqueId::from_env`].
pub const COMM_ID_VAR: &str = "RSCCL_COMM_ID";
/// The environment variable with an optional shared secret for rendezvous ids.
pub const COMM_SECRET_VAR: &str = "RSCCL_COMM_SECRET";

/// Bytes 0..4 of [`UniqueId::to_bytes`].
const ID_MAGIC: [u8; 4] = *b"RSID";
/// Byte 4 of [`UniqueId::to_bytes`].
const ID_VERSION: u8 = 1;

/// The rendezvous of one communicator, as NCCL's `ncclUniqueId`: the root's address and a
/// random 128-bit secret. One process makes it (which starts the root listener in the
/// background); the others receive it by any means, as [bytes](UniqueId::to_bytes) or as
/// [text](UniqueId#impl-Display-for-UniqueId) (`host:port#<32 hex digits>`), and pass it to
/// [`Bootstrap::init`](super::Bootstrap::init). Every bootstrap connection must present the
/// secret; one that does not is dropped.
///
/// The root listener is a thread that accepts the ranks' connections, answers them once all
/// `nranks` have arrived (or tells them why bootstrap failed), and exits. It also exits, telling
/// whoever waits, when the first waiting rank's timeout is near or after [`DEFAULT_ROOT_TIMEOUT`]
/// (or the time given to [`UniqueId::with_addr_timeout`]) with no complete set of ranks.
///
/// ```
/// use rsccl::UniqueId;
/// let id = UniqueId::with_addr("127.0.0.1:0".parse().unwrap())?;
/// let text = id.to_string();
/// assert_eq!(text.parse::<UniqueId>()?, id);
/// assert_eq!(UniqueId::from_bytes(&id.to_bytes())?, id);
/// # Ok::<(), rsccl::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId {
    addr: SocketAddr,
    secret: Secret,
}

impl UniqueId {
    /// Bytes in [`UniqueId::to_bytes`] (NCCL's `NCCL_UNIQUE_ID_BYTES`).
    pub const BYTES: usize = 128;

    /// A new id with a random secret, its root listening on an ephemeral port of the interface
    /// that carries the default route (loopback where there is none), started in the background.
    pub fn new() -> Result<UniqueId> {
        Self::with_addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))
    }

    /// A new id with a random secret, its root listening at `addr` (port 0: an ephemeral one; an
    /// unspecified IP: every interface, announced as the default route's), started in the
    /// background, waiting at most [`DEFAULT_ROOT_TIMEOUT`].
    pub fn with_addr(addr: SocketAddr) -> Result<UniqueId> {
        Self::with_addr_timeout(addr, DEFAULT_ROOT_TIMEOUT)
    }

    /// As [`UniqueId::with_addr`], with the root waiting at most `root_timeout` for all ranks.
    pub fn with_addr_timeout(addr: SocketAddr, root_timeout: Duration) -> Result<UniqueId> {
        let secret =
            random_secret().map_err(|e| BootstrapError::Local { rank: None, what: e.to_string() })?;
        let id = Self::start_root_at(addr, secret, root_timeout)?;
        Ok(id)
    }

    /// An id formed from a rendezvous address that every process knows in advance (as torchrun's
    /// `MASTER_ADDR:MASTER_PORT`; pick a port other than torch's own store), with no secret
    /// carried out of band. The process of `rank` 0 hosts the root at `addr` (the call starts it);
    /// the others connect to it, retrying until it is up or their timeout ends.
    ///
    /// The secret is derived from `addr` (as written) and the environment variable
    /// `RSCCL_COMM_SECRET` where set (a job id, or random bytes shared by the launcher). This is
    /// weaker than [`UniqueId::new`]: without `RSCCL_COMM_SECRET`, anyone who knows the address
    /// knows the secret, so it only keeps apart jobs that reuse an address; with it, the secret
    /// is as strong as that value is unguessable.
    pub fn from_rendezvous(addr: &str, rank: usize) -> Result<UniqueId> {
        let text = addr.trim();
        let bad = |why: String| BootstrapError::BadId(format!("rendezvous address `{}`: {why}", clip(text)));
        let resolved = text
            .to_socket_addrs()
            .map_err(|e| bad(e.to_string()))?
            .min_by_key(|a| a.is_ipv6())
            .ok_or_else(|| bad("resolves to no address".into()))?;
        if resolved.port() == 0 {
            return Err(bad("port 0 cannot be agreed on in advance".into()).into());
        }
        let seed = std::env::var(COMM_SECRET_VAR).unwrap_or_default();
        let secret = derive_secret(text, &seed);
        if rank == 0 {
            Self::start_root_at(resolved, secret, DEFAULT_ROOT_TIMEOUT)
        } else {
            Ok(UniqueId { addr: resolved, secret })
        }
    }

    /// [`UniqueId::from_rendezvous`] with the address in `RSCCL_COMM_ID` (`host:port`); `None`
    /// where it is unset or empty.
    pub fn from_env(rank: usize) -> Result<Option<UniqueId>> {
        match std::env::var(COMM_ID_VAR) {
            Ok(v) if !v.trim().is_empty() => Self::from_rendezvous(&v, rank).map(Some),
            _ => Ok(None),
        }
    }

    /// Binds the root at `addr` and starts it.
    fn start_root_at(addr: SocketAddr, secret: Secret, root_timeout: Duration) -> Result<UniqueId> {
        let local = |what: String| BootstrapError::Local { rank: None, what };
        let listener = TcpListener::bind(addr)
            .map_err(|e| local(format!("cannot listen for the bootstrap root at {addr}: {e}")))?;
        let bound = listener.local_addr().map_err(|e| local(format!("bootstrap root listener: {e}")))?;
        let announced =
            if bound.ip().is_unspecified() { SocketAddr::new(default_ip(), bound.port()) } else { bound };
        root::start(listener, announced, secret, root_timeout)
            .map_err(|e| local(format!("cannot start the bootstrap root at {announced}: {e}")))?;
        Ok(UniqueId { addr: announced, secret })
    }

    /// The root's address.
    pub fn root_addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn secret(&self) -> &Secret {
        &self.secret
    }

    /// The id as [`UniqueId::BYTES`] bytes: `RSID`, version 1, the address (family, 16 address
    /// bytes, port), the secret, zeros.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[0..4].copy_from_slice(&ID_MAGIC);
        b[4] = ID_VERSION;
        b[5..5 + ADDR_LEN].copy_from_slice(&encode_addr(&self.addr));
        b[24..40].copy_from_slice(&self.secret);
        b
    }

    /// The id [`UniqueId::to_bytes`] wrote; anything else is refused with what is wrong.
    pub fn from_bytes(b: &[u8]) -> Result<UniqueId> {
        let bad = |why: &str| BootstrapError::BadId(format!("{} bytes: {why}", b.len()));
        if b.len() != Self::BYTES {
            return Err(bad(&format!("expected {}", Self::BYTES)).into());
        }
        if b[0..4] != ID_MAGIC {
            return Err(bad("not an rsccl unique id (wrong magic)").into());
        }
        if b[4] != ID_VERSION {
            return Err(bad(&format!("unique id version {}, expected {ID_VERSION}", b[4])).into());
        }
        let a: &[u8; ADDR_LEN] = b[5..5 + ADDR_LEN].try_into().expect("ADDR_LEN bytes");
        let addr = decode_addr(a).map_err(bad)?;
        if b[5 + ADDR_LEN..24].iter().chain(&b[40..]).any(|&x| x != 0) {
            return Err(bad("stray bytes in the padding").into());
        }
        let mut secret = [0u8; 16];
        secret.copy_from_slice(&b[24..40]);
        Ok(UniqueId { addr, secret })
    }
}

impl std::fmt::Display for UniqueId {
    /// `host:port#<32 hex digits of the secret>` (`[v6]:port#…` for IPv6).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#", self.addr)?;
        self.secret.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl std::fmt::Debug for UniqueId {
    /// The address only: the secret stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UniqueId").field("addr", &self.addr).field("secret", &"<hidden>").finish()
    }
}

impl FromStr for UniqueId {
    type Err = crate::Error;

    /// Parses what [`Display`](std::fmt::Display) wrote: `host:port#<32 hex digits>`.
    fn from_str(s: &str) -> Result<UniqueId> {
        let t = s.trim();
        let bad = |why: &str| {
            BootstrapError::BadId(format!("`{}`: {why} (expected `ip:port#<32 hex digits>`)", clip(t))).into()
        };
        let Some((addr, hex)) = t.rsplit_once('#') else { return Err(bad("no `#` before the secret")) };
        let addr: SocketAddr = addr.parse().map_err(|_| bad("not an ip:port address"))?;
        if hex.len() != 32 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad("the secret is not 32 hex digits"));
        }
        let mut secret = [0u8; 16];
        for (i, byte) in secret.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad("bad hex"))?;
        }
        Ok(UniqueId { addr, secret })
    }
}

/// At most 64 characters of `s`, for messages about untrusted text.
fn clip(s: &str) -> String {
    let c: String = s.chars().take(64).collect();
    if c.len() < s.len() {
        format!("{c}…")
    } else {
        c
    }
}

/// The rendezvous secret: a hash of the address text and the shared seed (not cryptographic;
/// see [`UniqueId::from_rendezvous`]).
fn derive_secret(addr: &str, seed: &str) -> Secret {
    let mut m = Vec::with_capacity(32 + addr.len() + seed.len());
    m.extend_from_slice(b"rsccl-rendezvous-v1\0");
    m.extend_from_slice(addr.as_bytes());
    m.push(0);
    m.extend_from_slice(seed.as_bytes());
    let h1 = mix64(fnv1a64(FNV_OFFSET, &m));
    let h2 = mix64(fnv1a64(FNV_OFFSET ^ 0x9e37_79b9_7f4a_7c15, &m) ^ h1);
    let mut s = [0u8; 16];
    s[..8].copy_from_slice(&h1.to_le_bytes());
    s[8..].copy_from_slice(&h2.to_le_bytes());
    s
}

/// The address of the interface that carries the default route (no packet is sent: connecting
/// a UDP socket only picks the route), or loopback where there is none.
fn default_ip() -> IpAddr {
    UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|u| u.connect((Ipv4Addr::new(192, 0, 2, 1), 9)).and_then(|_| u.local_addr()))
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_unspecified())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> UniqueId {
        UniqueId { addr: "127.0.0.1:29500".parse().unwrap(), secret: *b"0123456789abcdef" }
    }

    #[test]
    fn bytes_and_text_round_trip() {
        let a = id();
        assert_eq!(UniqueId::from_bytes(&a.to_bytes()).unwrap(), a);
        assert_eq!(a.to_string(), "127.0.0.1:29500#30313233343536373839616263646566");
        assert_eq!(a.to_string().parse::<UniqueId>().unwrap(), a);
        let v6 = UniqueId { addr: "[::1]:7".parse().unwrap(), ..a };
        assert_eq!(v6.to_string().parse::<UniqueId>().unwrap(), v6);
        assert_eq!(UniqueId::from_bytes(&v6.to_bytes()).unwrap(), v6);
        assert!(!format!("{a:?}").contains("3031"));
    }

    #[test]
    fn garbage_is_refused() {
        for s in [
            "",
            "#",
            "127.0.0.1:1#",
            "127.0.0.1#00112233445566778899aabbccddeeff",
            "x:1#00",
            "127.0.0.1:1#zz112233445566778899aabbccddeeff",
            "127.0.0.1:1#00112233445566778899aabbccddeeff00",
        ] {
            let e = s.parse::<UniqueId>().unwrap_err().to_string();
            assert!(e.starts_with("bootstrap: bad unique id"), "{s}: {e}");
        }
        let good = id().to_bytes();
        assert!(UniqueId::from_bytes(&good[..127]).is_err());
        for (i, v) in [(0, b'X'), (4, 9), (5, 3), (100, 1), (10, 1)] {
            let mut b = good;
            b[i] = v;
            assert!(UniqueId::from_bytes(&b).is_err(), "byte {i}");
        }
    }

    #[test]
    fn derived_secrets_depend_on_address_and_seed() {
        let a = derive_secret("h:1", "");
        assert_eq!(a, derive_secret("h:1", ""));
        assert_ne!(a, derive_secret("h:2", ""));
        assert_ne!(a, derive_secret("h:1", "job7"));
    }
}

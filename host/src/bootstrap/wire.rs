//! The bootstrap wire format: the one definition of a message's header, the payloads' field
//! encodings, and reading and writing whole frames under deadlines.
//!
//! Every message is a frame: a fixed [`HEADER_LEN`]-byte header, then `len` payload bytes.
//!
//! | bytes   | field     | value                                                     |
//! |---------|-----------|-----------------------------------------------------------|
//! | 0..4    | magic     | [`MAGIC`] (`RSBS`)                                        |
//! | 4..6    | version   | [`VERSION`], little-endian                                |
//! | 6..8    | kind      | a [`Kind`], little-endian                                 |
//! | 8..24   | secret    | the [`UniqueId`](super::UniqueId)'s 128-bit secret        |
//! | 24..28  | len       | payload bytes, little-endian, at most the kind's bound    |
//!
//! A reader checks magic, version, secret, kind and then the length against the bound of what it
//! expects, all before it allocates anything for the payload; a connection that fails any check
//! is dropped. Payload integers are little-endian; strings and byte strings carry their length.
use super::cancel::{Cancel, CANCEL_POLL};
use super::secret::Secret;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The first four bytes of every bootstrap frame.
pub const MAGIC: [u8; 4] = *b"RSBS";
/// The protocol version; a peer speaking another one is refused.
pub const VERSION: u16 = 1;
/// Bytes in a frame header.
pub const HEADER_LEN: usize = 28;
/// The most user bytes one bootstrap message may carry (one `send`, one rank's `all_gather` or
/// `broadcast` block). Longer lengths on the wire are refused before anything is allocated.
pub const MAX_BOOTSTRAP_MSG: usize = 16 << 20;
/// The most bytes of `local_info` a rank may hand to [`Bootstrap::init`](super::Bootstrap::init).
pub const MAX_LOCAL_INFO: usize = 64 << 10;
/// The most ranks a bootstrap may have.
pub const MAX_RANKS: usize = 1 << 16;
/// Largest status a rank answers with (see
/// [`Bootstrap::set_status_provider`](super::Bootstrap::set_status_provider)); longer answers
/// are cut, and a longer reply on the wire is refused before anything is allocated.
pub const MAX_STATUS_BYTES: usize = 4096;
/// The longest host name carried (longer ones are cut).
pub(crate) const MAX_HOSTNAME: usize = 255;
/// Payload bound of the frames a peer sends before it is known (rank info, hellos, root errors).
pub(crate) const MAX_CONTROL_LEN: usize = MAX_LOCAL_INFO + 1024;
/// Payload bound of a data frame: the user bytes and the lane and tag in front of them.
pub(crate) const MAX_DATA_LEN: usize = MAX_BOOTSTRAP_MSG + 16;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Kind {
    /// Rank → root: who the rank is, where it listens, its local info.
    RankInfo = 1,
    /// Root → rank: one entry of the table of all ranks (sent `nranks` times, in rank order).
    PeerInfo = 2,
    /// Root → rank: bootstrap failed (missing ranks, duplicate rank, disagreeing `nranks`).
    RootError = 3,
    /// Rank → rank: the first frame on a peer connection (who connects to whom).
    Hello = 4,
    /// Rank → rank: a message (lane, tag, bytes).
    Data = 5,
    /// Any rank → rank: "what are you doing?", the first and only frame of a short-lived
    /// connection (who asks whom, as a `Hello`).
    StatusQuery = 6,
    /// Rank → asker: the answer to a `StatusQuery` (at most [`MAX_STATUS_BYTES`]); then the
    /// connection closes.
    StatusReply = 7,
}

impl Kind {
    /// The kind with this wire value, if any.
    pub fn from_u16(v: u16) -> Option<Kind> {
        Some(match v {
            1 => Kind::RankInfo,
            2 => Kind::PeerInfo,
            3 => Kind::RootError,
            4 => Kind::Hello,
            5 => Kind::Data,
            6 => Kind::StatusQuery,
            7 => Kind::StatusReply,
            _ => return None,
        })
    }
}

/// A frame header (see the [module docs](self) for the layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the frame is.
    pub kind: Kind,
    /// The secret the sender presents.
    pub secret: Secret,
    /// Payload bytes that follow.
    pub len: u32,
}

impl Header {
    /// The header's bytes, magic and version included.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&(self.kind as u16).to_le_bytes());
        b[8..24].copy_from_slice(&self.secret);
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Checks a received header against the expected secret and payload bound, in wire order:
    /// magic, version, secret, kind, length.
    pub(crate) fn check(b: &[u8; HEADER_LEN], secret: &Secret, max_len: usize) -> Result<Header, FrameError> {
        if b[0..4] != MAGIC {
            return Err(FrameError::BadMagic);
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(FrameError::BadVersion(version));
        }
        let mut presented = [0u8; 16];
        presented.copy_from_slice(&b[8..24]);
        if !secrets_equal(&presented, secret) {
            return Err(FrameError::BadSecret);
        }
        let kind_v = u16::from_le_bytes([b[6], b[7]]);
        let kind = Kind::from_u16(kind_v).ok_or(FrameError::BadKind(kind_v))?;
        let len = u32::from_le_bytes([b[24], b[25], b[26], b[27]]);
        if len as usize > max_len {
            return Err(FrameError::TooLong { len: len as usize, max: max_len });
        }
        Ok(Header { kind, secret: presented, len })
    }
}

/// Compares secrets in time that does not depend on where they differ.
fn secrets_equal(a: &Secret, b: &Secret) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a frame could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FrameError {
    /// The peer closed the connection after `got` bytes of the frame (0: between frames).
    Eof {
        got: usize,
    },
    /// The deadline passed.
    TimedOut,
    /// The wait's [`Cancel`] was cancelled.
    Cancelled,
    /// The peer reset the connection.
    Reset,
    BadMagic,
    BadVersion(u16),
    BadSecret,
    BadKind(u16),
    TooLong {
        len: usize,
        max: usize,
    },
    /// A frame of a kind that is not acceptable here.
    Unexpected(Kind),
    /// The payload does not decode.
    Malformed(&'static str),
    Io(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Eof { got: 0 } => write!(f, "connection closed"),
            FrameError::Eof { got } => write!(f, "connection closed after {got} bytes of a frame"),
            FrameError::TimedOut => write!(f, "timed out"),
            FrameError::Cancelled => write!(f, "aborted"),
            FrameError::Reset => write!(f, "connection reset"),
            FrameError::BadMagic => write!(f, "wrong magic (not an rsccl bootstrap peer)"),
            FrameError::BadVersion(v) => write!(f, "protocol version {v}, expected {VERSION}"),
            FrameError::BadSecret => write!(f, "wrong secret (not of this bootstrap)"),
            FrameError::BadKind(k) => write!(f, "unknown message kind {k}"),
            FrameError::TooLong { len, max } => write!(f, "message of {len} bytes, more than {max}"),
            FrameError::Unexpected(k) => write!(f, "unexpected {k:?} message"),
            FrameError::Malformed(what) => write!(f, "malformed message: {what}"),
            FrameError::Io(e) => write!(f, "{e}"),
        }
    }
}

fn io_err(e: io::Error) -> FrameError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => FrameError::TimedOut,
        io::ErrorKind::UnexpectedEof => FrameError::Eof { got: 0 },
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::BrokenPipe => {
            FrameError::Reset
        }
        _ => FrameError::Io(e.to_string()),
    }
}

/// How long a reader waits for a frame.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait<'a> {
    /// The whole frame by this instant.
    Until(Instant),
    /// As `Until`, or until the [`Cancel`] is cancelled (looked at every [`CANCEL_POLL`]).
    UntilCancelled(Instant, &'a Cancel),
    /// The first byte whenever it comes (an idle connection), then the rest within this time.
    Idle(Duration),
}

/// Time left until `deadline`, or `TimedOut`.
fn left(deadline: Instant) -> Result<Duration, FrameError> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        Err(FrameError::TimedOut)
    } else {
        Ok(d)
    }
}

/// Fills `buf`, each read bounded by `deadline` (none: block until data or close) and, where
/// `cancel` is given, ended by it within [`CANCEL_POLL`]. `done` counts bytes of the frame
/// before `buf`, for the report of a close in the middle.
fn read_full(
    s: &mut TcpStream,
    buf: &mut [u8],
    deadline: Option<Instant>,
    cancel: Option<&Cancel>,
    done: usize,
) -> Result<(), FrameError> {
    let mut got = 0;
    while got < buf.len() {
        if cancel.is_some_and(Cancel::is_cancelled) {
            return Err(FrameError::Cancelled);
        }
        let mut wait = deadline.map(left).transpose()?;
        if cancel.is_some() {
            wait = Some(wait.map_or(CANCEL_POLL, |w| w.min(CANCEL_POLL)));
        }
        s.set_read_timeout(wait).map_err(io_err)?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(FrameError::Eof { got: done + got }),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A spurious wake-up (or a cancel's slice) before the deadline reads again; `left`
            // ends it at the deadline.
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                if deadline.is_none() && cancel.is_none() {
                    return Err(FrameError::TimedOut);
                }
            }
            Err(e) => return Err(io_err(e)),
        }
    }
    Ok(())
}

/// Writes all of `buf` by `deadline`.
pub(crate) fn write_full(s: &mut TcpStream, buf: &[u8], deadline: Instant) -> Result<(), FrameError> {
    let mut put = 0;
    while put < buf.len() {
        s.set_write_timeout(Some(left(deadline)?)).map_err(io_err)?;
        match s.write(&buf[put..]) {
            Ok(0) => return Err(FrameError::Io("connection accepts no more bytes".into())),
            Ok(n) => put += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(io_err(e)),
        }
    }
    Ok(())
}

/// Reads one frame: checks its header against `secret` and `max_len`, then reads its payload.
pub(crate) fn read_frame(
    s: &mut TcpStream,
    secret: &Secret,
    wait: Wait,
    max_len: usize,
) -> Result<(Kind, Vec<u8>), FrameError> {
    let mut hb = [0u8; HEADER_LEN];
    let (deadline, cancel) = match wait {
        Wait::Until(d) => {
            read_full(s, &mut hb, Some(d), None, 0)?;
            (d, None)
        }
        Wait::UntilCancelled(d, c) => {
            read_full(s, &mut hb, Some(d), Some(c), 0)?;
            (d, Some(c))
        }
        Wait::Idle(t) => {
            read_full(s, &mut hb[..1], None, None, 0)?;
            let d = Instant::now() + t;
            read_full(s, &mut hb[1..], Some(d), None, 1)?;
            (d, None)
        }
    };
    let h = Header::check(&hb, secret, max_len)?;
    let mut payload = vec![0u8; h.len as usize];
    read_full(s, &mut payload, Some(deadline), cancel, HEADER_LEN)?;
    Ok((h.kind, payload))
}

/// A whole frame's bytes: header and payload.
pub(crate) fn frame(kind: Kind, secret: &Secret, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("frame payloads are bounded far below 4 GiB");
    let mut b = Vec::with_capacity(HEADER_LEN + payload.len());
    b.extend_from_slice(&Header { kind, secret: *secret, len }.encode());
    b.extend_from_slice(payload);
    b
}

/// Writes one frame by `deadline`, in one write where the kernel takes it.
pub(crate) fn write_frame(
    s: &mut TcpStream,
    secret: &Secret,
    kind: Kind,
    payload: &[u8],
    deadline: Instant,
) -> Result<(), FrameError> {
    write_full(s, &frame(kind, secret, payload), deadline)
}

/// Bytes of an encoded socket address: family (4 or 6), 16 address bytes, port.
pub(crate) const ADDR_LEN: usize = 19;

/// A socket address as [`ADDR_LEN`] bytes (an IPv4 address in the first 4 of the 16).
pub(crate) fn encode_addr(a: &SocketAddr) -> [u8; ADDR_LEN] {
    let mut b = [0u8; ADDR_LEN];
    match a.ip() {
        IpAddr::V4(ip) => {
            b[0] = 4;
            b[1..5].copy_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            b[0] = 6;
            b[1..17].copy_from_slice(&ip.octets());
        }
    }
    b[17..19].copy_from_slice(&a.port().to_le_bytes());
    b
}

/// The address [`encode_addr`] wrote, or what is wrong with the bytes.
pub(crate) fn decode_addr(b: &[u8; ADDR_LEN]) -> Result<SocketAddr, &'static str> {
    let port = u16::from_le_bytes([b[17], b[18]]);
    let ip = match b[0] {
        4 if b[5..17].iter().all(|&x| x == 0) => IpAddr::V4(Ipv4Addr::new(b[1], b[2], b[3], b[4])),
        4 => return Err("IPv4 address with stray bytes"),
        6 => {
            let mut o = [0u8; 16];
            o.copy_from_slice(&b[1..17]);
            IpAddr::V6(Ipv6Addr::from(o))
        }
        _ => return Err("unknown address family"),
    };
    Ok(SocketAddr::new(ip, port))
}

/// Builds a payload.
#[derive(Default)]
pub(crate) struct Enc(pub Vec<u8>);

impl Enc {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A count or index that fits in 32 bits (ranks, lengths: all bounded far below).
    pub fn usize(&mut self, v: usize) -> &mut Self {
        self.u32(u32::try_from(v).expect("bootstrap counts fit in 32 bits"))
    }
    /// Length-prefixed bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.usize(v.len());
        self.0.extend_from_slice(v);
        self
    }
    pub fn addr(&mut self, a: &SocketAddr) -> &mut Self {
        self.0.extend_from_slice(&encode_addr(a));
        self
    }
    /// The rest of the payload, no length (the frame's length bounds it).
    pub fn tail(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
}

/// Reads a payload; every getter fails on a short payload.
pub(crate) struct Dec<'a> {
    buf: &'a [u8],
}

impl<'a> Dec<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Dec { buf }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.buf.len() < n {
            return Err(FrameError::Malformed("payload too short"));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }
    pub fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32, FrameError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    pub fn u64(&mut self) -> Result<u64, FrameError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    pub fn usize(&mut self) -> Result<usize, FrameError> {
        Ok(self.u32()? as usize)
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], FrameError> {
        let n = self.usize()?;
        self.take(n)
    }
    pub fn addr(&mut self) -> Result<SocketAddr, FrameError> {
        let b: &[u8; ADDR_LEN] = self.take(ADDR_LEN)?.try_into().expect("ADDR_LEN bytes");
        decode_addr(b).map_err(FrameError::Malformed)
    }
    pub fn tail(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
    /// Fails if bytes are left over.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(FrameError::Malformed("trailing bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn header_round_trip_and_checks() {
        let s = [7u8; 16];
        let h = Header { kind: Kind::Data, secret: s, len: 10 };
        let b = h.encode();
        assert_eq!(Header::check(&b, &s, 10), Ok(h));
        assert_eq!(Header::check(&b, &s, 9), Err(FrameError::TooLong { len: 10, max: 9 }));
        assert_eq!(Header::check(&b, &[8u8; 16], 10), Err(FrameError::BadSecret));
        let mut m = b;
        m[0] = b'X';
        assert_eq!(Header::check(&m, &s, 10), Err(FrameError::BadMagic));
        let mut v = b;
        v[4] = 9;
        assert_eq!(Header::check(&v, &s, 10), Err(FrameError::BadVersion(9)));
        let mut k = b;
        k[6] = 99;
        assert_eq!(Header::check(&k, &s, 10), Err(FrameError::BadKind(99)));
    }

    #[test]
    fn frames_over_a_socket_with_deadlines() {
        let (mut a, mut b) = pair();
        let s = [1u8; 16];
        let soon = || Instant::now() + Duration::from_secs(5);
        write_frame(&mut a, &s, Kind::Hello, b"abc", soon()).unwrap();
        assert_eq!(read_frame(&mut b, &s, Wait::Until(soon()), 16).unwrap(), (Kind::Hello, b"abc".to_vec()));
        // Nothing sent: the reader gives up at its deadline.
        let t = Instant::now();
        let r = read_frame(&mut b, &s, Wait::Until(Instant::now() + Duration::from_millis(100)), 16);
        assert_eq!(r, Err(FrameError::TimedOut));
        assert!(t.elapsed() < Duration::from_secs(2));
        // Half a header, then silence: idle waits for the first byte only.
        a.write_all(&MAGIC[..2]).unwrap();
        let r = read_frame(&mut b, &s, Wait::Idle(Duration::from_millis(100)), 16);
        assert_eq!(r, Err(FrameError::TimedOut));
        drop(a);
        assert!(matches!(read_frame(&mut b, &s, Wait::Until(soon()), 16), Err(FrameError::Eof { .. })));
    }

    #[test]
    fn a_cancellable_read_keeps_a_slow_frame_whole_and_ends_when_cancelled() {
        let (mut a, mut b) = pair();
        let s = [1u8; 16];
        let cancel = Cancel::new();
        let soon = Instant::now() + Duration::from_secs(10);
        // A frame cut in two, its halves further apart than the cancel's poll: read whole.
        let f = frame(Kind::Hello, &s, b"abcdef");
        let (head, tail) = f.split_at(HEADER_LEN + 2);
        let (head, tail) = (head.to_vec(), tail.to_vec());
        let w = std::thread::spawn(move || {
            a.write_all(&head).unwrap();
            std::thread::sleep(CANCEL_POLL * 3);
            a.write_all(&tail).unwrap();
            a
        });
        let got = read_frame(&mut b, &s, Wait::UntilCancelled(soon, &cancel), 16).unwrap();
        assert_eq!(got, (Kind::Hello, b"abcdef".to_vec()));
        let _a = w.join().unwrap();
        // Nothing more comes: a cancel from another thread ends the wait long before its deadline.
        let c = cancel.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            c.cancel();
        });
        let asked = Instant::now();
        assert_eq!(
            read_frame(&mut b, &s, Wait::UntilCancelled(soon, &cancel), 16),
            Err(FrameError::Cancelled)
        );
        assert!(asked.elapsed() < Duration::from_secs(3), "{:?}", asked.elapsed());
        t.join().unwrap();
    }

    #[test]
    fn addresses_and_fields_round_trip() {
        for a in ["127.0.0.1:80", "[::1]:65535", "10.1.2.3:0"] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(decode_addr(&encode_addr(&a)), Ok(a));
        }
        let mut bad = encode_addr(&"1.2.3.4:5".parse().unwrap());
        bad[0] = 5;
        assert!(decode_addr(&bad).is_err());
        let mut e = Enc::default();
        e.u8(1).u32(2).u64(3).bytes(b"xy").addr(&"127.0.0.1:9".parse().unwrap()).tail(b"rest");
        let mut d = Dec::new(&e.0);
        assert_eq!(d.u8().unwrap(), 1);
        assert_eq!(d.u32().unwrap(), 2);
        assert_eq!(d.u64().unwrap(), 3);
        assert_eq!(d.bytes().unwrap(), b"xy");
        assert_eq!(d.addr().unwrap(), "127.0.0.1:9".parse().unwrap());
        assert_eq!(d.tail(), b"rest");
        d.finish().unwrap();
        assert!(Dec::new(&[1, 0]).u32().is_err());
        assert!(Dec::new(&[9, 0, 0, 0, 1]).bytes().is_err());
    }
}

//! The bytes the network transport puts on a socket, and the checks a reader makes before it
//! trusts any of them. Every decoder here takes a fixed-size array: no length read from the
//! wire sizes an allocation, and arbitrary bytes give an error, never a panic.
use crate::bootstrap::Secret;
use rsccl_device::prims::conn::NCCL_STEPS;

/// First word of every rsccl network frame ("RSNT").
pub const NET_MAGIC: u32 = 0x544e_5352;
/// Version of this wire format; both ends must speak the same.
pub const NET_VERSION: u16 = 2;
/// Most sockets one connection may use (NCCL's `MAX_SOCKETS`).
pub const MAX_SOCKETS: usize = 64;
/// Most helper threads one connection may use (NCCL's `MAX_THREADS`).
pub const MAX_THREADS: usize = 16;
/// Bytes of a listener handle.
pub const HANDLE_BYTES: usize = 48;
/// Bytes of the hello a connecting socket sends first.
pub const HELLO_BYTES: usize = 40;
/// Bytes of the listener's acknowledgement.
pub const ACK_BYTES: usize = 8;
/// Bytes of the header before each message's part on each socket.
pub const PART_BYTES: usize = 16;
/// Bytes of the proxy's control message (a kind word and up to six words of fields).
pub const CTRL_BYTES: usize = 56;

/// What was wrong with bytes read from a socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireError(pub String);

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn check_magic(b: &[u8], what: &str) -> Result<(), WireError> {
    let (magic, version) = (u32_at(b, 0), u16_at(b, 4));
    if magic != NET_MAGIC {
        return Err(WireError(format!("{what}: bad magic {magic:#010x} (not an rsccl network peer)")));
    }
    if version != NET_VERSION {
        return Err(WireError(format!("{what}: wire version {version}, this side speaks {NET_VERSION}")));
    }
    Ok(())
}

/// Where a listener waits and which connection it is for: what the receiver hands the sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    /// The listener's address.
    pub addr: std::net::SocketAddr,
    /// A random number naming this connection (sockets of another connection are refused).
    pub conn_id: u64,
}

impl Handle {
    /// The handle as bytes.
    pub fn encode(&self) -> [u8; HANDLE_BYTES] {
        let mut b = [0u8; HANDLE_BYTES];
        b[0..4].copy_from_slice(&NET_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&NET_VERSION.to_le_bytes());
        let ip = match self.addr.ip() {
            std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            std::net::IpAddr::V6(v6) => v6,
        };
        b[8..24].copy_from_slice(&ip.octets());
        b[24..26].copy_from_slice(&self.addr.port().to_le_bytes());
        b[32..40].copy_from_slice(&self.conn_id.to_le_bytes());
        b
    }

    /// Reads a handle, refusing anything that is not one.
    pub fn decode(b: &[u8]) -> Result<Handle, WireError> {
        let b: &[u8; HANDLE_BYTES] = b.try_into().map_err(|_| {
            WireError(format!("a network handle of {} bytes, expected {HANDLE_BYTES}", b.len()))
        })?;
        check_magic(b, "network handle")?;
        let v6 = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(&b[8..24]).expect("16 bytes"));
        let ip = match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None => std::net::IpAddr::V6(v6),
        };
        let port = u16_at(b, 24);
        if port == 0 {
            return Err(WireError("network handle: port 0".into()));
        }
        Ok(Handle { addr: std::net::SocketAddr::new(ip, port), conn_id: u64_at(b, 32) })
    }
}

/// The first bytes a connecting socket sends: who it is and which socket of the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The communicator's secret.
    pub secret: Secret,
    /// The connection (from the handle).
    pub conn_id: u64,
    /// This socket's index in the connection.
    pub index: u16,
    /// How many sockets the connection has.
    pub nsocks: u16,
}

const KIND_HELLO: u16 = 1;
const KIND_ACK: u16 = 2;

impl Hello {
    /// The hello as bytes.
    pub fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[0..4].copy_from_slice(&NET_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&NET_VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&KIND_HELLO.to_le_bytes());
        b[8..24].copy_from_slice(&self.secret);
        b[24..32].copy_from_slice(&self.conn_id.to_le_bytes());
        b[32..34].copy_from_slice(&self.index.to_le_bytes());
        b[34..36].copy_from_slice(&self.nsocks.to_le_bytes());
        b
    }

    /// Reads a hello and checks it against this listener's secret and connection.
    pub fn decode(b: &[u8; HELLO_BYTES], secret: &Secret, conn_id: u64) -> Result<Hello, WireError> {
        check_magic(b, "hello")?;
        if u16_at(b, 6) != KIND_HELLO {
            return Err(WireError(format!("hello: message kind {}", u16_at(b, 6))));
        }
        if &b[8..24] != secret {
            return Err(WireError("hello: wrong secret (not a member of this communicator)".into()));
        }
        let h =
            Hello { secret: *secret, conn_id: u64_at(b, 24), index: u16_at(b, 32), nsocks: u16_at(b, 34) };
        if h.conn_id != conn_id {
            return Err(WireError(format!("hello: for connection {:#x}, this is {conn_id:#x}", h.conn_id)));
        }
        if h.nsocks == 0 || h.nsocks as usize > MAX_SOCKETS || h.index >= h.nsocks {
            return Err(WireError(format!(
                "hello: socket {} of {} (at most {MAX_SOCKETS} sockets)",
                h.index, h.nsocks
            )));
        }
        Ok(h)
    }
}

/// The listener's answer once every socket of the connection arrived.
pub fn encode_ack() -> [u8; ACK_BYTES] {
    let mut b = [0u8; ACK_BYTES];
    b[0..4].copy_from_slice(&NET_MAGIC.to_le_bytes());
    b[4..6].copy_from_slice(&NET_VERSION.to_le_bytes());
    b[6..8].copy_from_slice(&KIND_ACK.to_le_bytes());
    b
}

/// Checks the listener's answer.
pub fn decode_ack(b: &[u8; ACK_BYTES]) -> Result<(), WireError> {
    check_magic(b, "acknowledgement")?;
    match u16_at(b, 6) {
        KIND_ACK => Ok(()),
        k => Err(WireError(format!("acknowledgement: message kind {k}"))),
    }
}

/// The header of one message's part on one socket: the message's sequence number on this
/// socket and its total size (each socket carries the range [`part_range`] gives).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartHeader {
    /// Messages sent on this socket before this one (mod 2^32).
    pub seq: u32,
    /// Bytes of the whole message.
    pub total: u64,
}

impl PartHeader {
    /// The header as bytes.
    pub fn encode(&self) -> [u8; PART_BYTES] {
        let mut b = [0u8; PART_BYTES];
        b[0..4].copy_from_slice(&NET_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.total.to_le_bytes());
        b
    }

    /// Reads a header, checking it is the `seq`-th message and fits `max` bytes.
    pub fn decode(b: &[u8; PART_BYTES], seq: u32, max: u64) -> Result<PartHeader, WireError> {
        if u32_at(b, 0) != NET_MAGIC {
            return Err(WireError(format!("message header: bad magic {:#010x}", u32_at(b, 0))));
        }
        let h = PartHeader { seq: u32_at(b, 4), total: u64_at(b, 8) };
        if h.seq != seq {
            return Err(WireError(format!("message header: message {} where {seq} was due", h.seq)));
        }
        if h.total > max {
            return Err(WireError(format!(
                "message header: a message of {} bytes for a receive of at most {max}",
                h.total
            )));
        }
        Ok(h)
    }
}

/// Smallest part of a message a socket carries when a message is split (NCCL's
/// `MIN_CHUNKSIZE`).
pub const MIN_PART: u64 = 64 * 1024;

/// The byte range of a `total`-byte message that socket `index` of `nsocks` carries: parts of
/// `max(MIN_PART, ⌈total / nsocks⌉)` bytes in socket order (the last ones may be empty).
///
/// ```
/// use rsccl::transport::net::wire::part_range;
/// assert_eq!(part_range(100, 4, 0), 0..100); // small: all on the first socket
/// assert_eq!(part_range(100, 4, 1), 100..100);
/// assert_eq!(part_range(1 << 20, 4, 3), (3 << 18)..(1 << 20));
/// ```
pub fn part_range(total: u64, nsocks: usize, index: usize) -> std::ops::Range<u64> {
    let n = nsocks.max(1) as u64;
    let part = total.div_ceil(n).max(MIN_PART);
    let start = part.saturating_mul(index as u64).min(total);
    start..start.saturating_add(part).min(total)
}

/// What the sending proxy tells the receiving one: before each slice, where it goes; before a
/// call's first slice, the call's signature (`prims::signature`); before it closes, goodbye.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ctrl {
    /// A slice follows: `bytes` of data starting in step `step`'s slot; the receiver's `tail`
    /// advances to `step + steps`.
    Slice {
        /// The step whose slot the data starts in.
        step: u64,
        /// Steps covered, 1..=`NCCL_STEPS`.
        steps: u64,
        /// Bytes of data that follow.
        bytes: u64,
    },
    /// The signature the sender's kernel wrote for the call starting at `step` (a `CallSig`
    /// as words), for the receiver's slot of that step.
    Sign {
        /// The call's first step.
        step: u64,
        /// The signature's words.
        sig: [u64; 4],
    },
    /// The sender closes the connection in order (its communicator was dropped after sending
    /// everything): the receiver then takes the end of the stream as the end of the
    /// connection, not as a lost peer.
    Goodbye,
}

const CTRL_SLICE: u64 = 1;
const CTRL_SIGN: u64 = 2;
const CTRL_GOODBYE: u64 = 3;

impl Ctrl {
    /// The control message as bytes.
    pub fn encode(&self) -> [u8; CTRL_BYTES] {
        let words: [u64; 7] = match *self {
            Ctrl::Slice { step, steps, bytes } => [CTRL_SLICE, step, steps, bytes, 0, 0, 0],
            Ctrl::Sign { step, sig } => [CTRL_SIGN, step, sig[0], sig[1], sig[2], sig[3], 0],
            Ctrl::Goodbye => [CTRL_GOODBYE, 0, 0, 0, 0, 0, 0],
        };
        let mut b = [0u8; CTRL_BYTES];
        for (chunk, w) in b.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// Reads a control message and checks it against the receiver's FIFO: a slice or
    /// signature must start at or after `next` (steps only move forward), and a slice's data
    /// must fit the slots from its first one to the end of the FIFO (`step_bytes` each)
    /// without wrapping.
    pub fn decode(b: &[u8; CTRL_BYTES], next: u64, step_bytes: u64) -> Result<Ctrl, WireError> {
        let w = |i: usize| u64_at(b, 8 * i);
        let went_back =
            |step: u64| WireError(format!("control: step {step} went back (expected {next} or later)"));
        match w(0) {
            CTRL_GOODBYE => Ok(Ctrl::Goodbye),
            CTRL_SIGN => {
                let step = w(1);
                if step < next {
                    return Err(went_back(step));
                }
                Ok(Ctrl::Sign { step, sig: [w(2), w(3), w(4), w(5)] })
            }
            CTRL_SLICE => {
                let (step, steps, bytes) = (w(1), w(2), w(3));
                if step < next {
                    return Err(went_back(step));
                }
                if steps == 0 || steps > NCCL_STEPS || step.checked_add(steps).is_none() {
                    return Err(WireError(format!("control: a slice of {steps} steps")));
                }
                let room = (NCCL_STEPS - step % NCCL_STEPS).saturating_mul(step_bytes);
                if bytes > room {
                    return Err(WireError(format!(
                        "control: {bytes} bytes at step {step} overflow the FIFO ({room} bytes left in it)"
                    )));
                }
                Ok(Ctrl::Slice { step, steps, bytes })
            }
            k => Err(WireError(format!("control: unknown kind {k}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frames_round_trip() {
        let h = Handle { addr: "127.0.0.1:4242".parse().unwrap(), conn_id: 99 };
        assert_eq!(Handle::decode(&h.encode()).unwrap(), h);
        let h6 = Handle { addr: "[::1]:7".parse().unwrap(), conn_id: 1 };
        assert_eq!(Handle::decode(&h6.encode()).unwrap(), h6);
        let hello = Hello { secret: [7; 16], conn_id: 5, index: 1, nsocks: 2 };
        assert_eq!(Hello::decode(&hello.encode(), &[7; 16], 5).unwrap(), hello);
        decode_ack(&encode_ack()).unwrap();
        let p = PartHeader { seq: 3, total: 1000 };
        assert_eq!(PartHeader::decode(&p.encode(), 3, 1000).unwrap(), p);
        let c = Ctrl::Slice { step: 10, steps: 2, bytes: 4096 };
        assert_eq!(Ctrl::decode(&c.encode(), 8, 2048).unwrap(), c);
        assert_eq!(Ctrl::decode(&Ctrl::Goodbye.encode(), 8, 2048).unwrap(), Ctrl::Goodbye);
        let s = Ctrl::Sign { step: 12, sig: [7, u64::MAX, 3, 1 << 40] };
        assert_eq!(Ctrl::decode(&s.encode(), 12, 2048).unwrap(), s);
    }

    #[test]
    fn every_bad_field_is_refused_and_named() {
        let hello = Hello { secret: [7; 16], conn_id: 5, index: 0, nsocks: 1 };
        assert!(Hello::decode(&hello.encode(), &[8; 16], 5).unwrap_err().0.contains("secret"));
        assert!(Hello::decode(&hello.encode(), &[7; 16], 6).unwrap_err().0.contains("connection"));
        let mut b = hello.encode();
        b[0] ^= 1;
        assert!(Hello::decode(&b, &[7; 16], 5).unwrap_err().0.contains("magic"));
        let mut b = hello.encode();
        b[4] = 9;
        assert!(Hello::decode(&b, &[7; 16], 5).unwrap_err().0.contains("version"));
        let bad = Hello { index: 2, nsocks: 2, ..hello };
        assert!(Hello::decode(&bad.encode(), &[7; 16], 5).is_err());
        let p = PartHeader { seq: 3, total: 1000 };
        assert!(PartHeader::decode(&p.encode(), 4, 1000).unwrap_err().0.contains("due"));
        assert!(PartHeader::decode(&p.encode(), 3, 999).unwrap_err().0.contains("at most 999"));
        let c = Ctrl::Slice { step: 7, steps: 1, bytes: 2049 };
        assert!(Ctrl::decode(&c.encode(), 0, 2048).unwrap_err().0.contains("overflow"));
        assert!(Ctrl::decode(&c.encode(), 8, 4096).unwrap_err().0.contains("went back"));
        let c = Ctrl::Slice { step: 7, steps: 9, bytes: 0 };
        assert!(Ctrl::decode(&c.encode(), 0, 2048).is_err());
        let s = Ctrl::Sign { step: 7, sig: [1, 2, 3, 4] };
        assert!(Ctrl::decode(&s.encode(), 8, 2048).unwrap_err().0.contains("went back"));
        let mut b = c.encode();
        b[0] = 9;
        assert!(Ctrl::decode(&b, 0, 2048).unwrap_err().0.contains("unknown kind 9"));
        assert!(Handle::decode(&[0u8; 47]).is_err());
    }

    #[test]
    fn parts_cover_a_message_once_in_order() {
        for total in [0u64, 1, 65535, 65536, 65537, 1 << 20, (1 << 20) + 3, 10_000_019] {
            for nsocks in 1..=9 {
                let mut at = 0;
                for i in 0..nsocks {
                    let r = part_range(total, nsocks, i);
                    assert_eq!(r.start, at, "{total} {nsocks} {i}");
                    assert!(r.end >= r.start);
                    at = r.end;
                }
                assert_eq!(at, total);
            }
        }
    }

    proptest! {
        /// Arbitrary bytes never panic a decoder, and anything accepted satisfies its bounds.
        #[test]
        fn decoders_take_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64),
                                   next in any::<u64>(), step_bytes in 128u64..(1 << 24)) {
            let mut h = [0u8; HELLO_BYTES];
            let n = bytes.len().min(HELLO_BYTES);
            h[..n].copy_from_slice(&bytes[..n]);
            if let Ok(x) = Hello::decode(&h, &[0; 16], 0) {
                prop_assert!(x.index < x.nsocks && x.nsocks as usize <= MAX_SOCKETS);
            }
            let _ = Handle::decode(&bytes);
            let mut p = [0u8; PART_BYTES];
            let n = bytes.len().min(PART_BYTES);
            p[..n].copy_from_slice(&bytes[..n]);
            if let Ok(x) = PartHeader::decode(&p, 0, 1 << 20) {
                prop_assert!(x.total <= 1 << 20);
            }
            let mut c = [0u8; CTRL_BYTES];
            let n = bytes.len().min(CTRL_BYTES);
            c[..n].copy_from_slice(&bytes[..n]);
            match Ctrl::decode(&c, next, step_bytes) {
                Ok(Ctrl::Slice { step, steps, bytes }) => {
                    prop_assert!(step >= next && (1..=NCCL_STEPS).contains(&steps));
                    prop_assert!(bytes <= (NCCL_STEPS - step % NCCL_STEPS) * step_bytes);
                }
                Ok(Ctrl::Sign { step, .. }) => prop_assert!(step >= next),
                Ok(Ctrl::Goodbye) | Err(_) => {}
            }
            let mut a = [0u8; ACK_BYTES];
            let n = bytes.len().min(ACK_BYTES);
            a[..n].copy_from_slice(&bytes[..n]);
            let _ = decode_ack(&a);
        }
    }
}

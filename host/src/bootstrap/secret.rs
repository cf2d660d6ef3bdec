//! The 128-bit secret a connection presents: bootstrap links, the socket and libfabric
//! transports' hellos and the exported net plugin's handles all use this one.

/// Bytes in a [`Secret`].
pub const SECRET_BYTES: usize = 16;

/// A connection secret: random per [`UniqueId`](super::UniqueId) or listen handle.
pub type Secret = [u8; SECRET_BYTES];

/// A fresh random [`Secret`] from `/dev/urandom`; the error says which file failed.
pub fn random_secret() -> std::io::Result<Secret> {
    use std::io::Read;
    let mut s = [0u8; SECRET_BYTES];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut s)).map_err(|e| {
        std::io::Error::new(e.kind(), format!("reading a random secret from /dev/urandom: {e}"))
    })?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_secrets_differ() {
        let (a, b) = (super::random_secret().unwrap(), super::random_secret().unwrap());
        assert_ne!(a, b);
    }
}

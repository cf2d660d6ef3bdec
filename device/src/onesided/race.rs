//! The emulator's race check for one-sided puts: two different ranks writing overlapping bytes
//! of one window with no wait of the window's owner between them (one "signal epoch") is a
//! race — the seed's failure mode of a sender running ahead of its receiver. The check keeps,
//! per window, the byte ranges put since the owner last finished a wait, and who put them.
//! On a GPU these are no-ops (the check needs a global view only the emulator has).

/// Records a put of `[off, off + bytes)` by `writer` into the window at `base`; returns
/// another rank that wrote overlapping bytes in the same epoch.
#[cfg(not(target_arch = "nvptx64"))]
pub fn put(base: u64, off: u64, bytes: u64, writer: u32) -> Option<u32> {
    if bytes == 0 {
        return None;
    }
    let mut windows = emu::WINDOWS.lock().unwrap_or_else(|e| e.into_inner());
    let puts = windows.entry(base).or_default();
    let end = off + bytes;
    let other = puts.iter().find(|p| p.writer != writer && p.start < end && off < p.end).map(|p| p.writer);
    if puts.len() < emu::MAX_RANGES {
        puts.push(emu::Put { start: off, end, writer });
    }
    other
}

/// The owner of the window at `base` finished a wait: what was put before is now ordered
/// before whatever it does next, so a new epoch starts.
#[cfg(not(target_arch = "nvptx64"))]
pub fn synced(base: u64) {
    let mut windows = emu::WINDOWS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = windows.get_mut(&base) {
        p.clear();
    }
}

/// Forgets the window at `base` (the host frees it; its address may be reused).
#[cfg(not(target_arch = "nvptx64"))]
pub fn forget(base: u64) {
    emu::WINDOWS.lock().unwrap_or_else(|e| e.into_inner()).remove(&base);
}

/// No race check on a GPU.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn put(_base: u64, _off: u64, _bytes: u64, _writer: u32) -> Option<u32> {
    None
}

/// No race check on a GPU.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn synced(_base: u64) {}

#[cfg(not(target_arch = "nvptx64"))]
mod emu {
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// Ranges kept per window and epoch (older ones beyond it are not checked: a bound on
    /// memory, not on correctness of what is reported).
    pub const MAX_RANGES: usize = 4096;

    pub struct Put {
        pub start: u64,
        pub end: u64,
        pub writer: u32,
    }

    pub static WINDOWS: std::sync::LazyLock<Mutex<HashMap<u64, Vec<Put>>>> =
        std::sync::LazyLock::new(|| Mutex::new(HashMap::new()));
}

//! Byte packs (NCCL's `BytePack<N>` in `op128.h`): the unit one thread loads, reduces and stores.
//!
//! A pack is `N` ∈ {1, 2, 4, 8, 16} bytes held in two 64-bit words (little-endian, the bytes at
//! and above `N` are zero), which is what the 16-byte `ld.volatile.global.v2.b64` yields; smaller
//! packs use the low word only and LLVM keeps just the bits it needs in a register. Lanes of
//! elements are views of those bytes, element `i` of size `S` at bytes `[i·S, (i+1)·S)`, as in
//! memory. Data loads are volatile as in NCCL: the buffers are written by peers through the
//! memory system while this kernel runs, so the compiler must neither cache nor elide them.
use crate::{arch, DevPtr};

/// `N` bytes of data moved as one load/store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BytePack<const N: usize> {
    words: [u64; 2],
}

impl<const N: usize> BytePack<N> {
    /// Fails to compile for sizes other than the five a GPU moves in one instruction.
    const VALID: () = assert!(N == 1 || N == 2 || N == 4 || N == 8 || N == 16);
    /// The pack size in bytes.
    pub const BYTES: usize = N;

    /// The pack whose bytes are the low `N` bytes of the little-endian `lo`, `hi` words.
    #[inline(always)]
    pub const fn from_words(lo: u64, hi: u64) -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::VALID;
        let mask = if N >= 8 { u64::MAX } else { (1u64 << (8 * N)) - 1 };
        BytePack { words: [lo & mask, if N == 16 { hi } else { 0 }] }
    }

    /// The two little-endian words (bytes at and above `N` are zero).
    #[inline(always)]
    pub const fn words(self) -> [u64; 2] {
        self.words
    }

    /// Bits `[bit, bit + width)` of the pack (`width` ≤ 64, not crossing a word).
    #[inline(always)]
    fn field(self, bit: usize, width: usize) -> u64 {
        let w = self.words[bit / 64] >> (bit % 64);
        if width == 64 {
            w
        } else {
            w & ((1u64 << width) - 1)
        }
    }

    #[inline(always)]
    fn set_field(&mut self, bit: usize, width: usize, v: u64) {
        let mask = if width == 64 { u64::MAX } else { (1u64 << width) - 1 };
        let w = &mut self.words[bit / 64];
        *w = (*w & !(mask << (bit % 64))) | ((v & mask) << (bit % 64));
    }

    /// Lane `i` of the 8-bit view.
    #[inline(always)]
    pub fn u8_lane(self, i: usize) -> u8 {
        self.field(8 * i, 8) as u8
    }
    /// Lane `i` of the 16-bit view.
    #[inline(always)]
    pub fn u16_lane(self, i: usize) -> u16 {
        self.field(16 * i, 16) as u16
    }
    /// Lane `i` of the 32-bit view.
    #[inline(always)]
    pub fn u32_lane(self, i: usize) -> u32 {
        self.field(32 * i, 32) as u32
    }
    /// Lane `i` of the 64-bit view.
    #[inline(always)]
    pub fn u64_lane(self, i: usize) -> u64 {
        self.words[i]
    }

    /// The `bytes`-wide lane `i` (`bytes` ∈ {1, 2, 4, 8}), zero-extended.
    #[inline(always)]
    pub fn lane(self, bytes: usize, i: usize) -> u64 {
        self.field(8 * bytes * i, 8 * bytes)
    }
    /// Replaces the `bytes`-wide lane `i` with the low bits of `v`.
    #[inline(always)]
    pub fn set_lane(&mut self, bytes: usize, i: usize, v: u64) {
        self.set_field(8 * bytes * i, 8 * bytes, v)
    }

    /// Volatile global load of `N` bytes (`ld.volatile.global.{u8,u16,u32,u64,v2.b64}`).
    ///
    /// # Safety
    /// `p` is valid device memory of `N` bytes, aligned to `N`.
    #[inline(always)]
    pub unsafe fn load_volatile(p: DevPtr) -> Self {
        // SAFETY: the caller guarantees `p` holds N bytes aligned to N; each arm reads N bytes.
        unsafe {
            match N {
                1 => Self::from_words(arch::ld_volatile_u8(p.as_ptr()) as u64, 0),
                2 => Self::from_words(arch::ld_volatile_u16(p.as_ptr()) as u64, 0),
                4 => Self::from_words(arch::ld_volatile_u32(p.as_ptr()) as u64, 0),
                8 => Self::from_words(arch::ld_volatile_u64(p.as_ptr()), 0),
                _ => {
                    let [lo, hi] = arch::ld_volatile_u128(p.as_ptr());
                    Self::from_words(lo, hi)
                }
            }
        }
    }

    /// Global store of `N` bytes (`st.global.{u8,u16,u32,u64,v2.b64}`).
    ///
    /// # Safety
    /// `p` is valid device memory of `N` bytes, aligned to `N`.
    #[inline(always)]
    pub unsafe fn store(self, p: DevPtr) {
        let [lo, hi] = self.words;
        // SAFETY: the caller guarantees `p` holds N bytes aligned to N; each arm writes N bytes.
        unsafe {
            match N {
                1 => arch::st_global_u8(p.as_ptr(), lo as u8),
                2 => arch::st_global_u16(p.as_ptr(), lo as u16),
                4 => arch::st_global_u32(p.as_ptr(), lo as u32),
                8 => arch::st_global_u64(p.as_ptr(), lo),
                _ => arch::st_global_u128(p.as_ptr(), [lo, hi]),
            }
        }
    }
}

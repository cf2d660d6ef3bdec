//! Emulated NVLS multicast objects. On an sm_90 system a multicast address is one virtual range
//! backed by a buffer on every bound GPU: `multimem.ld_reduce` reads all of them and returns the
//! reduction, `multimem.st` writes all of them. Here a multicast address is a fake address in a
//! range no host pointer can have (above the 57-bit user address space), and [`bind`] records the
//! unicast buffers behind it; device code resolves an address to those buffers with
//! [`with_unicast`] and does the loads/stores itself, in the order the buffers were bound.
use crate::DevPtr;
use std::sync::RwLock;

/// First multicast address; each binding gets its own window of `1 << WINDOW_BITS` bytes.
const MC_BASE: u64 = 0x4000_0000_0000_0000;
const WINDOW_BITS: u32 = 40;

struct Binding {
    unicast: Vec<DevPtr>,
    bytes: u64,
}

/// Most unicast buffers behind one multicast range (an NVLink domain of up to 16 GPUs here).
pub const MAX_BOUND: usize = 16;

static REGISTRY: RwLock<Vec<Option<Binding>>> = RwLock::new(Vec::new());

/// A multicast range bound to a set of unicast buffers; unbinds when dropped.
#[derive(Debug)]
pub struct Multicast {
    slot: usize,
    addr: DevPtr,
}

/// Binds `unicast` buffers (each at least `bytes` long, in this order) to a new multicast range
/// of `bytes` bytes whose address is 16-byte aligned (windows are 2^40-aligned).
///
/// ```
/// use rsccl_device::arch::emu::multicast;
/// use rsccl_device::DevPtr;
/// let (mut a, mut b) = ([0u32; 4], [0u32; 4]);
/// let mc = multicast::bind(&[DevPtr(a.as_mut_ptr() as u64), DevPtr(b.as_mut_ptr() as u64)], 16);
/// assert!(multicast::is_multicast(mc.addr()));
/// assert_eq!(multicast::with_unicast(mc.addr().offset(4), 4, |u| u.len()), 2);
/// ```
pub fn bind(unicast: &[DevPtr], bytes: u64) -> Multicast {
    assert!(!unicast.is_empty(), "a multicast object needs at least one unicast buffer");
    assert!(bytes < 1 << WINDOW_BITS, "multicast range of {bytes} bytes is too large");
    let mut reg = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    let binding = Binding { unicast: unicast.to_vec(), bytes };
    let slot = match reg.iter().position(Option::is_none) {
        Some(i) => {
            reg[i] = Some(binding);
            i
        }
        None => {
            reg.push(Some(binding));
            reg.len() - 1
        }
    };
    Multicast { slot, addr: DevPtr(MC_BASE + ((slot as u64) << WINDOW_BITS)) }
}

impl Multicast {
    /// The multicast address of the range's first byte.
    pub fn addr(&self) -> DevPtr {
        self.addr
    }
}

impl Drop for Multicast {
    fn drop(&mut self) {
        let mut reg = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
        reg[self.slot] = None;
    }
}

/// Whether `p` lies in the multicast address range (bound or not).
#[inline]
pub fn is_multicast(p: DevPtr) -> bool {
    p.0 >= MC_BASE
}

/// Calls `f` with the unicast addresses behind `[p, p + bytes)`, in bind order.
///
/// Panics (which fails an emulated launch, like a GPU fault) if `p` is not inside a bound
/// multicast range or the access runs past its end.
pub fn with_unicast<R>(p: DevPtr, bytes: u64, f: impl FnOnce(&[DevPtr]) -> R) -> R {
    let rel = p.0.wrapping_sub(MC_BASE);
    let (slot, off) = ((rel >> WINDOW_BITS) as usize, rel & ((1 << WINDOW_BITS) - 1));
    let reg = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    let b = match reg.get(slot) {
        Some(Some(b)) if is_multicast(p) && off + bytes <= b.bytes => b,
        _ => panic!("multimem access of {bytes} bytes at {:#x} is outside every bound multicast range", p.0),
    };
    assert!(b.unicast.len() <= MAX_BOUND, "more than {MAX_BOUND} buffers bound to one multicast object");
    let mut addrs = [DevPtr::NULL; MAX_BOUND];
    let n = b.unicast.len();
    for (a, u) in addrs.iter_mut().zip(&b.unicast) {
        *a = u.offset(off);
    }
    drop(reg);
    f(&addrs[..n])
}

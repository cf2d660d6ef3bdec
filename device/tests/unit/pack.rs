//! `rsccl_device::pack`'s tests (run as an integration test: see `main.rs`).
use rsccl_device::pack::*;
use rsccl_device::DevPtr;

#[test]
fn lanes_are_little_endian_views_of_memory_order() {
    let bytes: [u8; 16] = core::array::from_fn(|i| (i as u8).wrapping_mul(17).wrapping_add(3));
    let lo = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let hi = u64::from_le_bytes(bytes[8..].try_into().unwrap());
    let p = BytePack::<16>::from_words(lo, hi);
    for (i, b) in bytes.iter().enumerate() {
        assert_eq!(p.u8_lane(i), *b);
    }
    for i in 0..8 {
        assert_eq!(p.u16_lane(i), u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]));
    }
    for i in 0..4 {
        assert_eq!(p.u32_lane(i), u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap()));
    }
    assert_eq!(p.u64_lane(1), hi);
}

#[test]
fn small_packs_keep_only_their_bytes_and_set_lane_touches_one_lane() {
    let p = BytePack::<2>::from_words(0xDEAD_BEEF, 0x1234);
    assert_eq!(p.words(), [0xBEEF, 0]);
    let mut q = BytePack::<8>::from_words(0x1122_3344_5566_7788, 0);
    q.set_lane(2, 1, 0xABCD);
    assert_eq!(q.words()[0], 0x1122_3344_ABCD_7788);
    q.set_lane(4, 1, 0xFFFF_FFFF_0000_0001);
    assert_eq!(q.words()[0], 0x0000_0001_ABCD_7788);
}

#[test]
fn loads_and_stores_move_exactly_n_bytes_in_the_emulator() {
    use rsccl_device::arch::{emu, Dim3};
    let mut buf = [0u128; 3];
    let base = DevPtr(buf.as_mut_ptr() as u64);
    let src: [u8; 16] = core::array::from_fn(|i| i as u8 + 1);
    // SAFETY: `buf` outlives the launch and is 16-byte aligned; one thread touches it.
    unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), base.as_ptr::<u8>(), 16) };
    let dims = emu::LaunchDims { grid: Dim3::x(1), block: Dim3::x(1), smem_bytes: 0 };
    emu::launch(dims, &|| {
        // SAFETY: every access is inside `buf` and aligned to its size.
        unsafe {
            BytePack::<16>::load_volatile(base).store(base.offset(16));
            BytePack::<4>::load_volatile(base.offset(4)).store(base.offset(36));
            BytePack::<1>::load_volatile(base.offset(15)).store(base.offset(41));
        }
    })
    .unwrap();
    let out: [u8; 48] = bytemuck::cast(buf);
    assert_eq!(out[16..32], src);
    assert_eq!(out[32..48], [0, 0, 0, 0, 5, 6, 7, 8, 0, 16, 0, 0, 0, 0, 0, 0]);
}

//! reduceCopy kernels (`rsccl_redcopy_<type>`, the op an argument) on any backend against the scalar reference:
//! the GPU bundle's counterpart of the CPU property test (`tests/reduce_copy_emu_props.rs`).
use crate::reference;
use rsccl::backend::{Backend, LaunchConfig};
use rsccl_device::dtype::DataType;
use rsccl_device::redop::RedOp;
use rsccl_device::reduce_copy::{MAX_DSTS, MAX_SRCS};
use rsccl_device::reduce_kernels::{kernel_name, RedCopyArgs};

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Runs one unicast reduceCopy of `nelem` elements from `nsrcs` sources into `ndsts` destinations,
/// each pointer `misalign` elements past a 256-byte boundary, and compares every element and the
/// guard bytes after each destination.
#[allow(clippy::too_many_arguments)]
pub fn run(
    be: &dyn Backend,
    t: DataType,
    op: RedOp,
    nsrcs: usize,
    ndsts: usize,
    nelem: usize,
    misalign: usize,
    seed: u64,
) -> Result<(), String> {
    assert!(nsrcs <= MAX_SRCS && ndsts <= MAX_DSTS);
    let e = |x: rsccl::Error| x.to_string();
    let eb = t.size();
    let off = misalign * eb;
    let bytes = off + nelem * eb + 64;
    let mut s = seed | 1;
    let arg = match op {
        RedOp::SumPostDiv => nsrcs as u64,
        RedOp::PreMulSum => rsccl::comm::scalar_bits(t, 0.5),
        _ => 0,
    };
    let mut vals = vec![vec![0u64; nelem]; nsrcs];
    let mut args = RedCopyArgs {
        nelem: nelem as u64,
        arg,
        nsrcs: nsrcs as u32,
        ndsts: ndsts as u32,
        op: op as u32,
        ..Default::default()
    };
    let mut keep = Vec::new();
    for (k, v) in vals.iter_mut().enumerate() {
        let buf = be.alloc(bytes).map_err(e)?;
        let mut host = vec![0u8; bytes];
        for (i, x) in v.iter_mut().enumerate() {
            // Any non-NaN encoding (NaN payloads differ between GPU and reference).
            *x = loop {
                let r = xorshift(&mut s);
                if !reference::is_nan(t, r) {
                    break r;
                }
            };
            host[off + i * eb..off + (i + 1) * eb].copy_from_slice(&x.to_le_bytes()[..eb]);
        }
        be.copy_in(&buf, 0, &host).map_err(e)?;
        args.srcs[k] = buf.ptr().offset(off as u64);
        keep.push(buf);
    }
    let mut dsts = Vec::new();
    for k in 0..ndsts {
        let buf = be.alloc(bytes).map_err(e)?;
        be.copy_in(&buf, 0, &vec![0xA5; bytes]).map_err(e)?;
        args.dsts[k] = buf.ptr().offset(off as u64);
        dsts.push(buf);
    }
    args.pre_op_srcs = if op == RedOp::PreMulSum { 1 } else { 0 };
    args.post_op = (op == RedOp::SumPostDiv) as u32;
    let blocks = (nelem / 65_536).clamp(1, 64) as u32;
    // SAFETY: every source and destination is a live buffer of `bytes` bytes at offset `off`,
    // holding the `nelem` elements the kernel reads or writes.
    unsafe { be.launch(&kernel_name(t), LaunchConfig::linear(blocks, 256), &args) }.map_err(e)?;
    be.synchronize().map_err(e)?;
    for (k, d) in dsts.iter().enumerate() {
        let mut out = vec![0u8; bytes];
        be.copy_out(d, 0, &mut out).map_err(e)?;
        if out[..off].iter().chain(&out[off + nelem * eb..]).any(|&b| b != 0xA5) {
            return Err(format!("{} {}: destination {k}: guard bytes changed", t.name(), op.name()));
        }
        for i in 0..nelem {
            let mut w = [0u8; 8];
            w[..eb].copy_from_slice(&out[off + i * eb..off + (i + 1) * eb]);
            let got = u64::from_le_bytes(w);
            let col: Vec<u64> = vals.iter().map(|v| v[i]).collect();
            let mask = if eb == 8 { u64::MAX } else { (1u64 << (8 * eb)) - 1 };
            let want = reference::fold(t, op, arg, &col, args.pre_op_srcs as usize, args.post_op != 0) & mask;
            if !reference::same(t, got, want) {
                return Err(format!(
                    "{} {}: destination {k} element {i}: got {got:#x}, reference {want:#x}",
                    t.name(),
                    op.name()
                ));
            }
        }
    }
    drop(keep);
    Ok(())
}

/// A (type, op) pair the kernels exist for on a device of compute capability `cc`.
pub fn available(t: DataType, op: RedOp, cc: Option<(i32, i32)>) -> bool {
    op.supports(t) && !(t.requires_sm90() && cc.is_some_and(|c| c.0 < 9))
}

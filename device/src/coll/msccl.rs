//! The MSCCL-IR interpreter: one block per threadblock of a program, each running its steps
//! on the Simple primitives with one receive and one send connection (MSCCL's runtime).
//!
//! **Chunk layout.** A rank's `i` and `o` buffers are whole blocks of `count` elements (one
//! rank's share of the collective), `P` chunks per block; scratch has `s_chunks` chunks. A
//! chunk is moved in passes so that what one step moves fits one FIFO chunk: pass `p` covers
//! elements `p·P·F .. (p+1)·P·F` of every block (`F`, the piece, from the host), and within
//! it chunk `k` of the block is the `Fp` elements from `k·Fp` (`Fp = F`, on the last pass
//! `⌈rest / P⌉`, the last chunks shorter or empty). So the pieces of consecutive chunks of a
//! block lie side by side, and a step moving `cnt` chunks moves each run of consecutive
//! positions in one primitive call (as MSCCL's runtime moves a step in one call). Scratch
//! chunk `j` of pass `p` is the `Fp` elements at `p·s_chunks·F + j·Fp`. How many elements a
//! chunk holds depends on which input position `0..P` its data came from; the host works that
//! out from the program's symbolic run and gives it per step and chunk
//! ([`MscclStep::pos`]).
//!
//! **Dependencies.** A step with `has_dep` publishes its completion in its threadblock's
//! progress word (`seq << 32 | pass·nsteps + step + 1`, `seq` counting the launches); a step
//! depending on it waits until that word is at least the value it expects.
use crate::prims::{ConnInfo, DataMover, ErrorCode, Op, Primitives, PrimsStatus};
use crate::{arch, DevPtr};

/// Threads per block of the interpreter (the Simple protocol's block size).
pub const MSCCL_THREADS: u32 = super::SIMPLE_THREADS;

/// Slices per call of the interpreter's primitives. One slice of one FIFO slot per call: a
/// connection then holds [`MSCCL_FIFO_CALLS`] calls that no receiver has taken yet, so a
/// threadblock may send that many steps ahead of its peer (programs that send several chunks
/// to a peer before receiving from it need it; the host checks each program against it).
pub const MSCCL_SLICES_PER_CHUNK: u64 = 1;
/// FIFO slots per slice (see [`MSCCL_SLICES_PER_CHUNK`]).
pub const MSCCL_STEPS_PER_SLICE: u64 = 1;
/// Calls a connection holds before its sender must wait for the receiver.
pub const MSCCL_FIFO_CALLS: u64 =
    crate::prims::conn::NCCL_STEPS / (MSCCL_SLICES_PER_CHUNK * MSCCL_STEPS_PER_SLICE);

/// `MscclStep::dep_tb` of a step without a dependency.
pub const NO_DEP: u32 = u32::MAX;

/// Which buffer a step reads or writes (`MscclStep::src_buf`, `dst_buf`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MscclBuf {
    /// The user's input (`i`).
    Input = 0,
    /// The user's output (`o`).
    Output = 1,
    /// The program's scratch buffer (`s`).
    Scratch = 2,
}

/// What a step does (the MSCCL-IR step types).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MscclOp {
    /// `s`: send the source.
    Send = 0,
    /// `r`: receive into the destination.
    Recv = 1,
    /// `rcs`: receive into the destination and send it on.
    RecvCopySend = 2,
    /// `rrs`: reduce what arrives with the source and send it.
    RecvReduceSend = 3,
    /// `rrc`: reduce what arrives with the source into the destination.
    RecvReduceCopy = 4,
    /// `rrcs`: reduce into the destination and send it on.
    RecvReduceCopySend = 5,
    /// `cpy`: copy the source to the destination.
    Copy = 6,
    /// `re`: reduce the source into the destination.
    Reduce = 7,
    /// `nop`: only dependencies.
    Nop = 8,
}

impl MscclOp {
    /// Decodes `MscclStep::kind`.
    pub fn from_u32(v: u32) -> Option<MscclOp> {
        Some(match v {
            0 => MscclOp::Send,
            1 => MscclOp::Recv,
            2 => MscclOp::RecvCopySend,
            3 => MscclOp::RecvReduceSend,
            4 => MscclOp::RecvReduceCopy,
            5 => MscclOp::RecvReduceCopySend,
            6 => MscclOp::Copy,
            7 => MscclOp::Reduce,
            8 => MscclOp::Nop,
            _ => return None,
        })
    }

    /// Whether the step reduces (a byte kernel cannot run it).
    pub const fn reduces(self) -> bool {
        matches!(
            self,
            MscclOp::RecvReduceSend | MscclOp::RecvReduceCopy | MscclOp::RecvReduceCopySend | MscclOp::Reduce
        )
    }

    /// The primitive operation; `None` for `nop`.
    #[inline(always)]
    fn prim(self) -> Option<Op> {
        Some(match self {
            MscclOp::Send => Op::SEND,
            MscclOp::Recv => Op::RECV,
            MscclOp::RecvCopySend => Op::RECV_COPY_SEND,
            MscclOp::RecvReduceSend => Op::RECV_REDUCE_SEND,
            MscclOp::RecvReduceCopy => Op::RECV_REDUCE_COPY,
            MscclOp::RecvReduceCopySend => Op::RECV_REDUCE_COPY_SEND,
            MscclOp::Copy => Op::COPY,
            MscclOp::Reduce => Op::REDUCE,
            MscclOp::Nop => return None,
        })
    }
}

/// One step of a threadblock, as the host lays it out in device memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MscclStep {
    /// [`MscclOp`] as u32.
    pub kind: u32,
    /// [`MscclBuf`] of the source.
    pub src_buf: u32,
    /// First source chunk.
    pub src_off: u32,
    /// [`MscclBuf`] of the destination.
    pub dst_buf: u32,
    /// First destination chunk.
    pub dst_off: u32,
    /// Consecutive chunks the step moves.
    pub cnt: u32,
    /// Threadblock this step waits for ([`NO_DEP`]: none).
    pub dep_tb: u32,
    /// The step of `dep_tb` it waits for.
    pub dep_step: u32,
    /// Nonzero: another threadblock waits for this step, so it publishes its completion.
    pub has_dep: u32,
    /// Index in [`MscclArgs::positions`] of the first chunk's input position (then one per
    /// chunk): which position `0..chunks_per_block` of a block the moved data comes from.
    pub pos: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(MscclStep {
    kind,
    src_buf,
    src_off,
    dst_buf,
    dst_off,
    cnt,
    dep_tb,
    dep_step,
    has_dep,
    pos
});

/// One threadblock: its connections and its steps.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MscclTb {
    /// Connection from the threadblock's receive peer (unconnected: none).
    pub recv: ConnInfo,
    /// Connection to its send peer (unconnected: none).
    pub send: ConnInfo,
    /// `MscclStep[nsteps]`.
    pub steps: DevPtr,
    /// Steps of the threadblock.
    pub nsteps: u64,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(MscclTb { recv, send, steps, nsteps });

/// Arguments of the interpreter kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MscclArgs {
    /// `MscclTb[gridDim.x]`.
    pub tbs: DevPtr,
    /// `u32[]`: input positions of moved chunks (see [`MscclStep::pos`]).
    pub positions: DevPtr,
    /// `u64[gridDim.x]`: each threadblock's progress word.
    pub progress: DevPtr,
    /// The user's input.
    pub input: DevPtr,
    /// The user's output.
    pub output: DevPtr,
    /// Scratch: `s_chunks` chunks per pass (see the module documentation).
    pub scratch: DevPtr,
    /// Elements of one block of `i`/`o` (a rank's share); bytes in the byte kernel.
    pub count: u64,
    /// Elements of a chunk per pass but the last (`F`); at most one FIFO chunk over the
    /// program's largest `cnt`.
    pub piece_elems: u64,
    /// Chunks per block (`P`).
    pub chunks_per_block: u64,
    /// Scratch chunks.
    pub scratch_chunks: u64,
    /// FIFO slot size in bytes.
    pub step_bytes: u64,
    /// This launch's number on the program (the progress words' high half).
    pub seq: u64,
    /// Error reporting and abort.
    pub status: PrimsStatus,
    /// The reduction operator (`RedOp` as u32; sum, prod, min or max).
    pub op: u32,
    /// Padding.
    pub _pad: u32,
}
// SAFETY: repr(C); the macro checks that every field is Pod and there is no padding.
crate::pod::unsafe_impl_pod!(MscclArgs {
    tbs,
    positions,
    progress,
    input,
    output,
    scratch,
    count,
    piece_elems,
    chunks_per_block,
    scratch_chunks,
    step_bytes,
    seq,
    status,
    op,
    _pad
});

/// Most elements one primitive call of the interpreter moves: one FIFO chunk, whole
/// 16-element groups per slice (the primitives' slice rounding must not exceed a slot).
#[inline(always)]
pub const fn pass_elems(step_bytes: u64, elem_bytes: u64) -> u64 {
    (step_bytes / elem_bytes * MSCCL_STEPS_PER_SLICE / 16) * 16 * MSCCL_SLICES_PER_CHUNK
}

/// The geometry of one pass: `(first element of the pass in a block, elements of the pass
/// in a block, piece Fp)`.
#[inline(always)]
pub const fn pass_geometry(count: u64, per: u64, piece: u64, pass: u64, passes: u64) -> (u64, u64, u64) {
    let base = pass * per * piece;
    let rest = count - base;
    let region = if rest < per * piece { rest } else { per * piece };
    let fp = if pass + 1 < passes { piece } else { region.div_ceil(per) };
    (base, region, fp)
}

/// The element offset of chunk `j` of buffer `buf` in the pass at `base` with piece `fp`.
#[inline(always)]
fn chunk_start(a: &MscclArgs, buf: u32, j: u64, pass: u64, base: u64, fp: u64) -> u64 {
    if buf == MscclBuf::Scratch as u32 {
        pass * a.scratch_chunks * a.piece_elems + j * fp
    } else {
        let p = a.chunks_per_block;
        (j / p) * a.count + base + (j % p) * fp
    }
}

#[inline(always)]
fn buf_base(a: &MscclArgs, buf: u32) -> DevPtr {
    match buf {
        0 => a.input,
        1 => a.output,
        _ => a.scratch,
    }
}

/// Thread 0 waits until threadblock `tb`'s progress word reaches `want`; false on a timeout or
/// abort (reported in this block's status word as a dependency timeout naming `tb`).
#[inline(always)]
fn wait_progress(a: &MscclArgs, tb: u32, want: u64, bid: u32) -> bool {
    let p = a.progress.offset(8 * tb as u64).as_ptr::<u64>();
    let (block, step) = (bid as u64, want & 0xFFFF_FFFF);
    // SAFETY: the host gives one 8-byte progress word per block, and the status words.
    unsafe { a.status.wait_at_least(p, want, block, ErrorCode::DependencyTimeout, tb as u64, step) }
}

/// Runs threadblock `blockIdx.x` of the program (see the module documentation).
#[inline(always)]
pub fn msccl_kernel<M: DataMover>(a: &MscclArgs, mover: &M) {
    let bid = arch::block_idx().x;
    let tid = arch::thread_idx().x;
    let nthreads = arch::block_dim().x;
    // SAFETY: the host gives one MscclTb per block, alive for the launch.
    let tb = unsafe { &*a.tbs.as_ptr::<MscclTb>().add(bid as usize) };
    let (recv, send) = (core::slice::from_ref(&tb.recv), core::slice::from_ref(&tb.send));
    if !crate::prims::signature::calls_match(&a.status, bid, &[recv], &[send]) {
        return;
    }
    let mut prims = Primitives::<M, 1, 1, MSCCL_SLICES_PER_CHUNK, MSCCL_STEPS_PER_SLICE>::new(
        mover,
        tid,
        nthreads,
        core::slice::from_ref(&tb.recv),
        core::slice::from_ref(&tb.send),
        a.input,
        a.output,
        a.step_bytes,
        0,
        a.status,
        bid,
    );
    let eb = mover.elem_bytes();
    let (per, piece) = (a.chunks_per_block, a.piece_elems);
    if per == 0 || piece == 0 {
        arch::trap();
    }
    let passes = a.count.div_ceil(per * piece);
    let nsteps = tb.nsteps;
    let seq = a.seq << 32;
    'passes: for pass in 0..passes {
        let (base, region, fp) = pass_geometry(a.count, per, piece, pass, passes);
        for s in 0..nsteps {
            // SAFETY: `nsteps` steps at `steps`, read in place.
            let st = unsafe { &*tb.steps.as_ptr::<MscclStep>().add(s as usize) };
            if st.dep_tb != NO_DEP {
                let mut ok = true;
                if tid == 0 {
                    // SAFETY: the host checked dep_tb < gridDim.x.
                    let dep_steps = unsafe { (*a.tbs.as_ptr::<MscclTb>().add(st.dep_tb as usize)).nsteps };
                    // After a failed wait of this block the dependency may never come.
                    ok = !prims.aborted()
                        && wait_progress(
                            a,
                            st.dep_tb,
                            seq | (pass * dep_steps + st.dep_step as u64 + 1),
                            bid,
                        );
                }
                // Everyone learns of a failed wait, and reads what the dependency wrote after it.
                if arch::bar_red_or(0, nthreads, !ok) {
                    break 'passes;
                }
            }
            let kind = MscclOp::from_u32(st.kind);
            let Some(op) = kind.and_then(MscclOp::prim) else {
                if kind.is_none() {
                    arch::trap();
                }
                continue;
            };
            let (src, dst) = (buf_base(a, st.src_buf), buf_base(a, st.dst_buf));
            let pos = |c: u32| {
                // SAFETY: the host gives `cnt` positions from `pos` for every step.
                unsafe { arch::ld_volatile_u32(a.positions.offset(4 * (st.pos as u64 + c as u64)).as_ptr()) }
            };
            // Each run of consecutive positions is one call: their pieces lie side by side.
            let mut c = 0;
            while c < st.cnt {
                let k0 = pos(c);
                let mut m = 1;
                while c + m < st.cnt && pos(c + m) == k0 + m {
                    m += 1;
                }
                let n = region.saturating_sub(k0 as u64 * fp).min(m as u64 * fp);
                let s_at = chunk_start(a, st.src_buf, (st.src_off + c) as u64, pass, base, fp) * eb;
                let d_at = chunk_start(a, st.dst_buf, (st.dst_off + c) as u64, pass, base, fp) * eb;
                prims.set_user_buffers(src.offset(s_at), dst.offset(d_at));
                prims.run(op, 0, 0, n as i64, false);
                c += m;
            }
            if st.has_dep != 0 {
                // Every thread's part of the step is done before it is published.
                arch::bar_sync(0, nthreads);
                if tid == 0 && !prims.aborted() {
                    arch::fence_acq_rel_sys();
                    let p = a.progress.offset(8 * bid as u64).as_ptr::<u64>();
                    // SAFETY: this block's progress word.
                    unsafe { arch::st_relaxed_sys_u64(p, seq | (pass * nsteps + s + 1)) };
                }
            }
        }
    }
    prims.finish();
}

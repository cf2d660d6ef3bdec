//! A host program for the user's kernel crate in `../kernel`: on each of N ranks,
//! `out = a·x + y` with the crate's own kernel (`embed_scale_add`), then a sum all-reduce of
//! `out` across the ranks with rsccl, checked against the same computed here on the host. On
//! the GPU when there is one (every rank on it; the kernel's module is the one build.rs made for
//! the GPU's arch), else on the CPU emulator; `RSCCL_BACKEND=cpu|gpu|auto` chooses.
//!
//! ```text
//! cargo run -p rsccl-embed-host -- [RANKS] [COUNT]
//! ```
use rsccl::{backend, BufRef, Comm, CommConfig, DataType, LaunchConfig, Preference, ReduceOp};
use rsccl_embed_kernel::{FusedArgs, ScaleAddArgs, THREADS};
use std::process::ExitCode;

/// The modules build.rs wrote with rsccl-build: the kernel crate's PTX (and cubins) per arch.
mod kernels {
    use rsccl::ptx::Module;
    include!(concat!(env!("OUT_DIR"), "/rsccl-kernels/modules.rs"));
}

/// The scale `a`.
const A: f32 = 3.0;
/// Blocks of the scale-and-add launch (the kernel strides over the rest).
const MAX_BLOCKS: usize = 8;

/// Rank `r`'s x and y at element `i`: small integers, so every sum is exact in f32 whatever
/// the order of the reduction.
fn x(r: usize, i: usize) -> f32 {
    ((i * 7 + r) % 101) as f32
}
fn y(r: usize, i: usize) -> f32 {
    ((i + 3 * r) % 13) as f32
}

fn arg(i: usize, default: usize) -> Result<usize, String> {
    match std::env::args().nth(i) {
        None => Ok(default),
        Some(v) => match v.parse() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "argument {i} ({v:?}) is not a positive count; usage: rsccl-embed-host [RANKS] [COUNT]"
            )),
        },
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let ranks = arg(1, 3)?;
    let count = arg(2, 100_003)?;
    // The kernel table, for the CPU emulator (which runs the crate's host build of the kernel)
    // and for both backends' launch checks (argument size, block size).
    rsccl_embed_kernel::register();
    // The PTX and cubins build.rs made, for the GPU backend, which loads a kernel's module by
    // its name for the GPU's arch on first launch.
    for &(arch, modules) in kernels::MODULES {
        rsccl::ptx::register_modules(arch, modules);
    }
    let be = backend::default_backend(Preference::from_env()?)?;
    println!("backend: {}", be.describe());
    if let Some((major, minor)) = be.compute_capability() {
        let arch = rsccl::ptx::arch_for(major, minor).ok_or("no module arch for this GPU")?;
        let m =
            rsccl::ptx::find(arch, "embed_scale_add")?.ok_or("build.rs made no embed_scale_add module")?;
        let form = if m.cubin.is_some() { "cubin and PTX" } else { "PTX" };
        println!("embed_scale_add: the {arch} module from build.rs ({form}, {} registers)", m.registers);
    }

    let comms = Comm::init_all(&be, ranks, CommConfig::default())?;
    let blocks = count.div_ceil(THREADS as usize).min(MAX_BLOCKS) as u32;
    let mut outs = Vec::with_capacity(ranks);
    for r in 0..ranks {
        let xs = be.upload(&(0..count).map(|i| x(r, i)).collect::<Vec<_>>())?;
        let ys = be.upload(&(0..count).map(|i| y(r, i)).collect::<Vec<_>>())?;
        let out = be.alloc(4 * count)?;
        let args = ScaleAddArgs { x: xs.ptr(), y: ys.ptr(), out: out.ptr(), n: count as u64, a: A, pad: 0 };
        // SAFETY: x, y and out hold `count` f32 each and live until the synchronize below.
        unsafe { be.launch("embed_scale_add", LaunchConfig::linear(blocks, THREADS), &args) }?;
        be.synchronize()?;
        outs.push(out);
    }
    let work = comms
        .iter()
        .zip(&outs)
        .map(|(c, o)| {
            c.enqueue().all_reduce(BufRef::from(o), BufRef::from(o), count, DataType::F32, ReduceOp::Sum)
        })
        .collect::<Result<Vec<_>, _>>()?;
    for w in work {
        w.wait()?;
    }

    let want: Vec<f32> = (0..count).map(|i| (0..ranks).map(|r| A * x(r, i) + y(r, i)).sum()).collect();
    for (r, o) in outs.iter().enumerate() {
        let got = be.download::<f32>(o, count)?;
        if let Some(i) = (0..count).find(|&i| got[i] != want[i]) {
            return Err(format!("rank {r}: element {i} is {}, the host computed {}", got[i], want[i]).into());
        }
    }
    println!(
        "scale-and-add (a = {A}) then all-reduce of {count} f32 over {ranks} ranks: every rank matches the host, {:?} …",
        &want[..count.min(3)]
    );

    // The same in one kernel: scale-and-add, then the all-reduce written with rsccl's one-sided
    // device API (copies into every rank's window, counted on semaphores) — twice, so the
    // second launch shows the first left its semaphores at zero.
    let window = ranks.checked_mul(4 * count).ok_or("window size overflows")?;
    std::thread::scope(|s| -> Result<(), String> {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, comm)| {
                let (be, want) = (&be, &want);
                s.spawn(move || -> Result<(), String> {
                    let err = |e: rsccl::Error| format!("rank {r}: {e}");
                    let mem = comm.alloc_symmetric(window).map_err(err)?;
                    let xs = be.upload(&(0..count).map(|i| x(r, i)).collect::<Vec<_>>()).map_err(err)?;
                    let ys = be.upload(&(0..count).map(|i| y(r, i)).collect::<Vec<_>>()).map_err(err)?;
                    let out = be.alloc(4 * count).map_err(err)?;
                    let s = ScaleAddArgs {
                        x: xs.ptr(),
                        y: ys.ptr(),
                        out: out.ptr(),
                        n: count as u64,
                        a: A,
                        pad: 0,
                    };
                    let args = FusedArgs { h: mem.handle(), s };
                    for _ in 0..2 {
                        // SAFETY: x, y and out hold `count` f32 each; every window holds
                        // `ranks × count` f32, the slots the kernel writes.
                        unsafe {
                            comm.launch_onesided(
                                &mem,
                                "embed_fused_all_reduce",
                                LaunchConfig::linear(4, THREADS),
                                &args,
                                &[&xs, &ys, &out],
                            )
                        }
                        .map_err(err)?;
                        let got = be.download::<f32>(&out, count).map_err(err)?;
                        if let Some(i) = (0..count).find(|&i| got[i] != want[i]) {
                            return Err(format!(
                                "rank {r}: fused element {i} is {}, the host computed {}",
                                got[i], want[i]
                            ));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter().try_for_each(|h| h.join().map_err(|_| "a rank panicked".to_string())?)
    })?;
    println!("fused scale-and-add + one-sided all-reduce in one kernel (twice): every rank matches the host");
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rsccl-embed-host: error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::kernels;

    /// build.rs compiled the user crate (which depends on rsccl-device) for nvptx with
    /// rsccl-build, for both archs, and ptxas accepted every kernel: each has a cubin and fits
    /// a block at its declared size, with the one-sided ops in the fused kernel's PTX.
    #[test]
    fn the_user_crate_compiled_for_nvptx_and_ptxas_accepted_it() {
        for arch in ["sm_90", "sm_80"] {
            let (_, modules) = kernels::MODULES
                .iter()
                .find(|(a, _)| *a == arch)
                .unwrap_or_else(|| panic!("build.rs made no {arch} modules"));
            for entry in ["embed_scale_add", "embed_fused_all_reduce"] {
                let m = modules
                    .iter()
                    .find(|m| m.entry == entry)
                    .unwrap_or_else(|| panic!("{arch} lacks {entry}"));
                assert!(m.cubin.is_some_and(|c| c.starts_with(b"\x7fELF")), "{arch} {entry}: no cubin");
                assert!(m.ptx.contains(&format!(".entry {entry}")), "{arch} {entry}: not an entry");
                assert!(m.ptx.contains(".maxntid 256, 1, 1"), "{arch} {entry}: no launch bound");
                assert!(
                    m.registers > 0 && m.registers * m.max_threads <= 65_536,
                    "{arch} {entry}: {} registers × {} threads",
                    m.registers,
                    m.max_threads
                );
            }
            let fused = modules.iter().find(|m| m.entry == "embed_fused_all_reduce").expect("checked");
            for ins in ["atom.acq_rel.sys.global.add.u64", "ld.acquire.sys.global.u64"] {
                assert!(fused.ptx.contains(ins), "{arch}: the fused kernel lacks `{ins}`");
            }
        }
    }
}

//! cudarc interop: the five collectives on a cudarc `CudaStream` with `CudaSlice<T>` buffers,
//! in NCCL's shape — the call enqueues and returns; work the caller puts on the stream later
//! runs after the collective, and the collective after the work already there.
//!
//! A communicator runs its kernels on a stream of its own; a call here makes that stream wait
//! for an event recorded on the caller's stream, enqueues the collective, and makes the
//! caller's stream wait for an event recorded after it. The slices are reached through cudarc's
//! `DevicePtr`/`DevicePtrMut`, whose guards record the use on the caller's stream (after that
//! wait), so cudarc orders later uses and the slices' frees after the collective.
use super::call::Call;
use super::communicator::Comm;
use super::work::Work;
use super::{BufRef, ReduceOp};
use crate::backend::DeviceBuffer;
use crate::error::{Error, Result};
use cudarc::driver::{result, sys, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use rsccl_device::dtype::DataType;
use rsccl_device::DevPtr;

/// An element type a collective takes in a cudarc `CudaSlice<T>`.
///
/// ```
/// use rsccl::comm::CudaElem;
/// use rsccl::DataType;
/// assert_eq!(<f32 as CudaElem>::DTYPE, DataType::F32);
/// assert_eq!(<u8 as CudaElem>::DTYPE, DataType::U8);
/// ```
pub trait CudaElem: cudarc::driver::DeviceRepr {
    /// Its rsccl type.
    const DTYPE: DataType;
}

macro_rules! cuda_elems {
    ($($t:ty => $d:ident),*) => {
        $(impl CudaElem for $t {
            const DTYPE: DataType = DataType::$d;
        })*
    };
}
cuda_elems!(i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64, f32 => F32, f64 => F64);

fn driver(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Driver { call, message: format!("{e:?}") }
}

/// A view of `bytes` of device memory at `ptr` for one enqueued collective: the memory belongs
/// to a cudarc slice, which cudarc keeps alive until the caller's stream passed the collective.
fn view(ptr: sys::CUdeviceptr, bytes: usize) -> DeviceBuffer {
    DeviceBuffer::new(DevPtr(ptr), bytes, Box::new(()))
}

/// The collectives on cudarc slices, declared once. Each item: its doc,
/// `name(send, recv, args…) [count = the count from the slices] => the Call`, built from
/// the slices' [`BufRef`]s (named as the slices) inside [`Comm::pair_on`].
macro_rules! cudarc_api {
    ($(
        $(#[$doc:meta])*
        $name:ident($send:ident, $recv:ident $(, $arg:ident: $ty:ty)*)
            $([$count:ident = $from:expr])? => $make:expr;
    )*) => {
        impl Comm {
            $(
                $(#[$doc])*
                pub fn $name<T: CudaElem>(
                    &self,
                    stream: &CudaStream,
                    $send: &CudaSlice<T>,
                    $recv: &mut CudaSlice<T>
                    $(, $arg: $ty)*
                ) -> Result<Work<'_>> {
                    $(let $count = $from;)?
                    self.pair_on(stream, $send, $recv, |$send, $recv| $make)
                }
            )*
        }
    };
}

cudarc_api! {
    /// Every rank's `recv` gets the reduction of all `send`s (`send.len()` elements), on the
    /// caller's cudarc stream (see the module notes).
    all_reduce_on(send, recv, op: ReduceOp) [n = send.len()] =>
        Call::all_reduce(send, recv, n, T::DTYPE, op);
    /// Rank r's `recv` gets block r (`recv.len()` elements) of the reduction of all `send`s
    /// (`nranks × recv.len()` elements each).
    reduce_scatter_on(send, recv, op: ReduceOp) [n = recv.len()] =>
        Call::reduce_scatter(send, recv, n, T::DTYPE, op);
    /// Every rank's `recv` (`nranks × send.len()` elements) gets all `send`s in rank order.
    all_gather_on(send, recv) [n = send.len()] => Call::all_gather(send, recv, n, T::DTYPE);
    /// Every rank's `recv` gets `root`'s `send` (`count` elements of each).
    broadcast_on(send, recv, count: usize, root: usize) =>
        Call::broadcast(send, recv, count, T::DTYPE, root);
    /// `root`'s `recv` gets the reduction of all `send`s (`count` elements of each).
    reduce_on(send, recv, count: usize, op: ReduceOp, root: usize) =>
        Call::reduce(send, recv, count, T::DTYPE, op, root);
}

impl Comm {
    /// [`Comm::all_reduce_on`] in place: `buf` holds the input and gets the result.
    pub fn all_reduce_in_place_on<T: CudaElem>(
        &self,
        stream: &CudaStream,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
    ) -> Result<Work<'_>> {
        let n = buf.len();
        let bytes = n * std::mem::size_of::<T>();
        let (p, _guard) = buf.device_ptr_mut(stream);
        let b = view(p, bytes);
        self.ordered_on(stream, |c| {
            c.start(Call::all_reduce(BufRef::from(&b), BufRef::from(&b), n, T::DTYPE, op))
        })
    }

    /// The call `make` builds from views of `send` and `recv` (its count is the collective's
    /// own: [`Comm::start`] checks both slices hold what it reads and writes).
    fn pair_on<T: CudaElem>(
        &self,
        stream: &CudaStream,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        make: impl for<'b> FnOnce(BufRef<'b>, BufRef<'b>) -> Call<'b>,
    ) -> Result<Work<'_>> {
        let eb = std::mem::size_of::<T>();
        let (send_bytes, recv_bytes) = (send.len() * eb, recv.len() * eb);
        let (sp, _sg) = send.device_ptr(stream);
        let (rp, _rg) = recv.device_ptr_mut(stream);
        let (s, r) = (view(sp, send_bytes), view(rp, recv_bytes));
        self.ordered_on(stream, |c| c.start(make(BufRef::from(&s), BufRef::from(&r))))
    }

    /// Runs `enqueue` on this communicator's stream between the caller's stream's work before
    /// and after it.
    fn ordered_on<'c>(
        &'c self,
        stream: &CudaStream,
        enqueue: impl FnOnce(&'c Comm) -> Result<Work<'c>>,
    ) -> Result<Work<'c>> {
        let Some((ctx, _)) = self.stream().cuda_stream() else {
            return Err(Error::InvalidConfig(
                "a cudarc stream with a communicator of the CPU emulator: use DeviceBuffer and BufRef".into(),
            ));
        };
        if stream.context().cu_ctx() != ctx {
            return Err(Error::InvalidConfig(format!(
                "rank {}: the cudarc stream belongs to another CUDA context (device {}) than the communicator's",
                self.rank(),
                stream.context().ordinal()
            )));
        }
        // SAFETY: the cudarc stream is live (borrowed) and of this communicator's context
        // (checked above).
        unsafe { self.wait_for_stream(stream.cu_stream()) }?;
        let work = enqueue(self)?;
        // SAFETY: as above.
        unsafe { self.signal_stream(stream.cu_stream()) }?;
        Ok(work)
    }
}

/// A CUDA stream handle as a C caller passes it (`cudaStream_t` and `CUstream` are the same
/// handle; null is the legacy default stream).
pub type RawStream = sys::CUstream;

impl Comm {
    /// Makes this communicator's next launch wait for the work already on `stream`: the call
    /// that follows runs after it (NCCL's order for a call given a `cudaStream_t`), while its
    /// host-side preparation does not wait. Does nothing on the CPU emulator, whose calls run
    /// in the order they are made.
    ///
    /// # Safety
    /// `stream` is null or a live stream of this communicator's CUDA context.
    pub unsafe fn wait_for_stream(&self, stream: RawStream) -> Result<()> {
        let Some((ctx, _)) = self.stream().cuda_stream() else { return Ok(()) };
        // The wait applies at this communicator's next launch: the host-side preparation of a
        // call (argument tables, the abort word) must not wait for the caller's work.
        // SAFETY: the caller's contract for `stream`.
        unsafe { in_context(ctx, || self.stream().defer_wait_for(stream)) }
    }

    /// Makes `stream` wait for the calls this communicator enqueued so far: work the caller
    /// puts on it next runs after them. Does nothing on the CPU emulator.
    ///
    /// # Safety
    /// As [`Comm::wait_for_stream`].
    pub unsafe fn signal_stream(&self, stream: RawStream) -> Result<()> {
        let Some((ctx, mine)) = self.stream().cuda_stream() else { return Ok(()) };
        // NVLS_TREE's worker launches its steps on this stream after its call returned, so an
        // event recorded now would not cover them: it ends first (its result stays for its
        // work), and the caller's stream then follows all of it.
        {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.flights.iter().any(|f| matches!(f, super::communicator::InFlight::NvlsTree(..))) {
                self.complete_in_flight(&mut q);
            }
        }
        // A wait no launch took (a call that moved nothing) still orders this stream first.
        self.stream().flush_deferred()?;
        // SAFETY: as above, in the other direction.
        unsafe { in_context(ctx, || join(mine, stream)) }
    }
}

impl Comm {
    /// Whether `stream` is being captured into a CUDA graph (`cuStreamIsCapturing`); `false`
    /// on the CPU emulator. rsccl's calls cannot be captured yet (their completion is tracked
    /// on the host), so the C API refuses a captured call instead of breaking the capture.
    ///
    /// # Safety
    /// As [`Comm::wait_for_stream`].
    pub unsafe fn stream_is_capturing(&self, stream: RawStream) -> Result<bool> {
        let Some((ctx, _)) = self.stream().cuda_stream() else { return Ok(false) };
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the caller's contract for `stream`; `status` is a local the call writes.
        unsafe {
            in_context(ctx, || {
                sys::cuStreamIsCapturing(stream, &mut status).result().map_err(driver("cuStreamIsCapturing"))
            })
        }?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }
}

/// Runs `f` with `ctx` current on this thread, then makes the caller's context current again
/// (a C caller's thread may have another device's context current).
///
/// # Safety
/// `ctx` is a live context.
unsafe fn in_context(ctx: sys::CUcontext, f: impl FnOnce() -> Result<()>) -> Result<()> {
    let before = result::ctx::get_current().map_err(driver("cuCtxGetCurrent"))?;
    if before == Some(ctx) {
        return f();
    }
    // SAFETY: the caller's contract.
    unsafe { result::ctx::set_current(ctx) }.map_err(driver("cuCtxSetCurrent"))?;
    let r = f();
    // SAFETY: the context that was current (or none) when this began.
    unsafe { result::ctx::set_current(before.unwrap_or(std::ptr::null_mut())) }
        .map_err(driver("cuCtxSetCurrent"))?;
    r
}

/// Makes `waiter` wait for the work on `first` so far: an event recorded on `first` and waited
/// for on `waiter`, then released (the driver keeps it until the wait is satisfied).
///
/// # Safety
/// Both are null or live streams of the current context.
unsafe fn join(first: RawStream, waiter: RawStream) -> Result<()> {
    let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
        .map_err(driver("cuEventCreate"))?;
    // SAFETY: a new event of the current context and the caller's streams; the event is
    // destroyed once, after the wait is enqueued, which CUDA allows.
    let r = unsafe {
        result::event::record(event, first).map_err(driver("cuEventRecord")).and_then(|()| {
            result::stream::wait_event(waiter, event, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
                .map_err(driver("cuStreamWaitEvent"))
        })
    };
    // SAFETY: as above.
    unsafe { result::event::destroy(event) }.map_err(driver("cuEventDestroy"))?;
    r
}

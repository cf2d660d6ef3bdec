//! Predicting calls without running them (NCCL's `ncclGroupSimulateEnd`): each call checked and
//! planned as it would run, then timed by the communicator's cost model ([`super::tuner`]).
use super::algorithm::Algorithm;
use super::call::Call;
use super::communicator::Comm;
use crate::error::Result;

impl Comm {
    /// How `call` would run on this rank — algorithm, protocol, channels and threads, as every
    /// rank plans it — without running it (the plan a [`Work`](super::Work) reports).
    ///
    /// ```
    /// # fn main() -> rsccl::Result<()> {
    /// use rsccl::comm::{Algorithm, Call, Protocol, ReduceOp};
    /// use rsccl::{backend, Comm, CommConfig, DataType};
    /// let be = backend::cpu();
    /// let comms = Comm::init_all(&be, 4, CommConfig { nthreads: 64, ..CommConfig::default() })?;
    /// let buf = be.alloc(4 << 20)?;
    /// let small = Call::all_reduce((&buf).into(), (&buf).into(), 16, DataType::F32, ReduceOp::Sum);
    /// let big = Call::all_reduce((&buf).into(), (&buf).into(), 1 << 20, DataType::F32, ReduceOp::Sum);
    /// let (s, b) = (comms[0].plan_call(&small)?, comms[0].plan_call(&big)?);
    /// // 64 bytes: the symmetric LL kernel (a block per channel); 4 MiB: Simple rings on
    /// // every channel.
    /// assert_eq!((s.algorithm, s.protocol, s.channels), (Algorithm::SymLl, Protocol::Ll, 2));
    /// assert_eq!((b.algorithm, b.protocol, b.channels), (Algorithm::Ring, Protocol::Simple, 2));
    /// // Without it (`RSCCL_ALGO=^symll`), LL rings on one channel (NCCL's shrink).
    /// let cfg = CommConfig { nthreads: 64, algo: Some("^symll".into()), ..CommConfig::default() };
    /// let rings = Comm::init_all(&be, 4, cfg)?;
    /// let s = rings[0].plan_call(&small)?;
    /// assert_eq!((s.algorithm, s.protocol, s.channels), (Algorithm::Ring, Protocol::Ll, 1));
    /// # Ok(())
    /// # }
    /// ```
    pub fn plan_call(&self, call: &Call<'_>) -> Result<super::Plan> {
        let dev = call.check(self.rank, self.nranks, self.stream.compute_capability())?;
        self.plan(call, &dev)
    }

    /// The predicted time of `calls` run one after another on this communicator, in µs: each
    /// checked and planned as [`Comm::run`] would (a call that would fail fails here, naming
    /// why), then timed by the cost model for its algorithm and protocol and its size
    /// (`latency + bytes / bandwidth`, NCCL's `ncclTopoGetAlgoTime`; the symmetric LL kernel by
    /// NCCL's symmetric-kernel model). Nothing is launched and no buffer is touched. A one-rank communicator predicts 0. Algorithms the model has no
    /// entry for on this communicator (MSCCL programs; NVLS where the table was built without
    /// it) are timed as the ring.
    ///
    /// ```
    /// use rsccl::{backend, BufRef, Call, Comm, CommConfig, DataType, ReduceOp};
    /// let be = backend::cpu();
    /// let comms = Comm::init_all(&be, 2, CommConfig { nthreads: 64, ..CommConfig::default() })?;
    /// let buf = be.alloc(4 << 20)?;
    /// let b = BufRef::from(&buf);
    /// let small = comms[0].estimate(&[Call::all_reduce(b, b, 16, DataType::F32, ReduceOp::Sum)])?;
    /// let big = comms[0].estimate(&[Call::all_reduce(b, b, 1 << 20, DataType::F32, ReduceOp::Sum)])?;
    /// assert!(0.0 < small && small < big);
    /// # Ok::<(), rsccl::Error>(())
    /// ```
    pub fn estimate(&self, calls: &[Call<'_>]) -> Result<f64> {
        let mut total = 0.0;
        for call in calls {
            let dev = call.check(self.rank, self.nranks, self.stream.compute_capability())?;
            if self.nranks == 1 || dev.count == 0 {
                continue;
            }
            let plan = self.plan(call, &dev)?;
            let bytes = self.nccl_bytes(&dev);
            total += match plan.algorithm {
                Algorithm::SymLl => self.tuner.sym_ll_us(bytes, plan.channels),
                _ => self.tuner.time_us(dev.coll, plan.algorithm, plan.protocol, bytes),
            };
        }
        Ok(total)
    }
}

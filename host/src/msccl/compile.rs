//! The compile driver: a traced [`Program`] through the pipeline — chunk DAG, instruction DAG,
//! fusion, schedule, instances — to MSCCL-IR. It sits above the stages, which read the
//! program's types from `dsl.rs` below them.
use super::chunk_dag::ChunkDag;
use super::dsl::Program;
use super::instr_dag::InstrDag;
use super::schedule::{self, Options};
use super::{fuse, ir, MscclError};

impl Program {
    /// Compiles to MSCCL-IR: trace → chunk DAG → instruction DAG → fusion → schedule.
    pub fn compile(&self) -> Result<ir::Program, MscclError> {
        self.compile_with(&Options::default())
    }

    /// [`Program::compile`] with explicit options (fusion on/off, instance layout).
    pub fn compile_with(&self, opts: &Options) -> Result<ir::Program, MscclError> {
        self.check_instances()?;
        // Each graph is freed as soon as the next stage is done with it, to lower peak memory.
        let mut idag = {
            let cdag = ChunkDag::trace(self);
            InstrDag::lower(self, &cdag)
        };
        if opts.fusion {
            fuse::fuse(&mut idag);
        }
        let ir = schedule::schedule(self, &idag)?;
        drop(idag);
        schedule::replicate(ir, self.instances)
    }
}

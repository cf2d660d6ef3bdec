//! The workspace's integration tests as one test binary (one link instead of one per file):
//! a module per concern. Child-process tests re-run this binary with `--exact MODULE::NAME`.
//! Tests that change or measure process-wide state (environment variables, the emulator's lane
//! mode, the deepest emulated stack) or run in release mode in CI keep binaries of their own
//! (`tests/*.rs`).
mod bootstrap;
mod comm_hardening;
mod comm_local;
mod comm_net;
mod comm_nvls;
mod comm_p2p;
mod comm_pipeline;
mod comm_plan;
mod comm_procs;
mod comm_topo;
mod comm_work;
mod embed;
mod emulator;
mod msccl_cli;
mod msccl_compile;
mod msccl_ir;
mod msccl_props;
mod msccl_runtime;
mod onesided;
mod overlap;
mod overlap_tune;
mod perf_env;
mod reduce_copy_ptx;
mod sym_ll;
mod topology_cli;
mod topology_comm;
mod topology_detect;
mod topology_errors;
mod topology_fixtures;
mod topology_rules;
mod tree_allreduce;
mod tuner_plugin;
mod tuning;

//! Compute–communication overlap by tile signals (FlashOverlap's design, arXiv 2504.19519): a
//! GEMM whose output feeds a collective signals each finished tile to a counter of its wave
//! group, and one communication kernel runs the collective on each group's slice of a reordered
//! output as soon as the group's count is reached.
//!
//! Phases, each using only the ones before it: [`curve`] (a bus-bandwidth curve: measured by
//! `rsccl perf`, or a named machine's figures), [`tune`] (the pipeline predictor and the choice
//! of wave groups), [`plan`] (a plan's checked tables: groups, tile order, where each tile
//! lands), [`routes`] (an all-to-all's row destinations and the piece tables they give), [`run`] (a plan on each rank's device: the GEMM, the gated collectives, the
//! restore), [`compare`] (a plan overlapped and in sequence, timed and compared), [`cli`]
//! (`rsccl overlap …`). The device side is `rsccl_device::overlap`.
pub mod cli;
pub mod compare;
pub mod curve;
pub mod plan;
pub mod routes;
pub mod run;
pub mod tune;

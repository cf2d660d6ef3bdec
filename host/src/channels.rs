//! Per-rank channel wiring (ring prev/next, tree up/down, NVLS heads) from the topology search.

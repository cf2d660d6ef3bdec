//! Workspace-level test and benchmark support (no public API).

//! Safe kernel wrappers: each op validates its arguments, sizes its workspace, and launches on the
//! caller's stream. Planning functions (workspace sizes, split counts) run without a GPU.

pub mod mla;
pub mod testing;

//! Safe kernel wrappers: each op validates its arguments, sizes its workspace, and launches on the
//! caller's stream. Planning functions (workspace sizes, split counts) run without a GPU.

pub mod cudnn;
pub mod mla;
pub mod nvfp4;
pub mod tensor;
pub mod testing;

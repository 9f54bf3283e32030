//! The C library: graphsafe's `extern "C"` functions (`graphsafe::capi`, declared in
//! `include/graphsafe.h`), built as `libgraphsafe.a` and `libgraphsafe.so`.
//!
//! The functions are `#[no_mangle]` items of the graphsafe crate; a static or shared library
//! exports every such item of the crates it links, so this crate only has to link graphsafe,
//! which naming it here does (an unused dependency would not be linked at all).

pub use graphsafe_rs::capi;

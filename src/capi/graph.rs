//! Graphs and executable graphs through the C ABI: node counts, instantiation, replay, upload.

use super::core::{lock, lock_eager, stream_obj, GraphExecObj, GraphObj, GraphsafeGraph, GraphsafeGraphExec, GraphsafeStream};
use super::handles::{self, Tag};
use super::{guard, null, put};
use std::ffi::c_int;
use std::sync::{Arc, Mutex};

/// Number of nodes in a graph (what the capture recorded).
///
/// # Safety
/// `out` is null (refused) or points to a writable `uint64_t`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_graph_node_count(graph: GraphsafeGraph, out: *mut u64) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let g = handles::get::<GraphObj>(Tag::Graph, graph.id)?;
        let n = lock(&g).node_kinds()?.len() as u64;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", n) }
    })
}

/// Instantiates an executable graph; it also keeps the captured buffers alive.
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeGraphExec`. Thread-safe (calls on one
/// graph serialize).
#[no_mangle]
pub unsafe extern "C" fn graphsafe_graph_instantiate(graph: GraphsafeGraph, out: *mut GraphsafeGraphExec) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let g = handles::get::<GraphObj>(Tag::Graph, graph.id)?;
        let e = lock(&g).instantiate()?;
        let id = handles::insert(Tag::GraphExec, Arc::new(Mutex::new(e)))?;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", GraphsafeGraphExec { id }) }
    })
}

/// Destroys a graph handle (executables made from it keep working).
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_graph_destroy(graph: GraphsafeGraph) -> c_int {
    guard(|| handles::remove::<GraphObj>(Tag::Graph, graph.id).map(drop))
}

/// Replays the executable on `stream` (refused while that stream is capturing).
///
/// # Safety
/// None (any value is checked). Thread-safe (launches of one executable serialize).
#[no_mangle]
pub unsafe extern "C" fn graphsafe_graph_exec_launch(exec: GraphsafeGraphExec, stream: GraphsafeStream) -> c_int {
    guard(|| {
        let e = handles::get::<GraphExecObj>(Tag::GraphExec, exec.id)?;
        let s = stream_obj(stream)?;
        let _st = lock_eager(&s, stream.id)?;
        let r = lock(&e).launch(&s.stream);
        Ok(r?)
    })
}

/// Uploads the executable's work ahead of its first launch.
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_graph_exec_upload(exec: GraphsafeGraphExec, stream: GraphsafeStream) -> c_int {
    guard(|| {
        let e = handles::get::<GraphExecObj>(Tag::GraphExec, exec.id)?;
        let s = stream_obj(stream)?;
        let _st = lock_eager(&s, stream.id)?;
        let r = lock(&e).upload(&s.stream);
        Ok(r?)
    })
}

/// Destroys an executable; captured buffers are freed once no graph or executable holds them.
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_graph_exec_destroy(exec: GraphsafeGraphExec) -> c_int {
    guard(|| handles::remove::<GraphExecObj>(Tag::GraphExec, exec.id).map(drop))
}

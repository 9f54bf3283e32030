//! What an engine on cudarc hands graphsafe: its context, a stream and a slice. Compiling this
//! proves that graphsafe's cudarc is the engine's (one crate, one set of types) whatever cudarc
//! features the engine chose: each engine crate under tests/consumers/ chooses its own.

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use graphsafe::driver::{Context, DeviceBuffer, Stream};
use std::sync::Arc;

/// graphsafe's views of the engine's objects.
pub struct Adopted {
    /// The engine's context.
    pub context: Arc<Context>,
    /// The engine's stream.
    pub stream: Stream,
    /// The engine's KV cache, held by every graph that captures it.
    pub kv_cache: DeviceBuffer,
}

/// Adopts the engine's context, stream and KV cache, after checking that both crates call one
/// driver.
///
/// # Safety
///
/// While a graphsafe capture is open on the adopted stream, the engine issues no cudarc work to
/// `stream` (graphsafe::driver::Stream::from_cudarc).
pub unsafe fn adopt(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, kv_cache: CudaSlice<u16>) -> graphsafe::Result<Adopted> {
    if !graphsafe::driver::cudarc::shares_driver()? {
        return Err(graphsafe::Error::invalid("cudarc", "one driver", "two"));
    }
    let context = Context::from_cudarc(ctx)?;
    // SAFETY: the caller's contract.
    let stream = unsafe { Stream::from_cudarc(&context, stream) }?;
    let kv_cache = DeviceBuffer::from_cudarc(&context, kv_cache)?;
    Ok(Adopted { context, stream, kv_cache })
}

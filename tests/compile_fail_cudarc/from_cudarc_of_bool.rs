// A cudarc slice of `bool` adopted as a graphsafe buffer could be written with any byte by
// graphsafe's own safe API (`memset_u8`, a copy, a kernel), and cudarc's safe read-back would then
// hand out `bool`s that are neither true nor false: undefined behaviour from safe code. Only element
// types for which every bit pattern is a valid value may be adopted.
use graphsafe::driver::{Context, DeviceBuffer};

fn main() {
    let cctx = cudarc::driver::CudaContext::new(0).unwrap();
    let ctx = Context::from_cudarc(&cctx).unwrap();
    let slice = cctx.default_stream().alloc_zeros::<bool>(16).unwrap();
    let _buf = DeviceBuffer::from_cudarc(&ctx, slice).unwrap();
}

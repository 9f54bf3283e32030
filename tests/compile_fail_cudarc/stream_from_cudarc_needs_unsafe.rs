// The engine keeps its own handle of a cudarc stream and can issue work to it through cudarc's safe
// API at any time, including while graphsafe captures on it (work whose memory no graph keeps
// alive): adopting it is a promise the caller makes, so it needs `unsafe`.
use graphsafe::driver::{Context, Stream};

fn main() {
    let cctx = cudarc::driver::CudaContext::new(0).unwrap();
    let ctx = Context::from_cudarc(&cctx).unwrap();
    let cs = cctx.new_stream().unwrap();
    let _stream = Stream::from_cudarc(&ctx, &cs).unwrap();
}

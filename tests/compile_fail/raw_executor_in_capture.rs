// The cuDNN floor executor borrows its stream: a capture (which takes the stream mutably) cannot
// begin while it lives, so its bare executes can never land in a graph that keeps neither its
// plan nor its handle (an earlier version of the executor let this compile).
use graphsafe::driver::Stream;
use graphsafe::graph::CaptureMode;
use graphsafe::ops::cudnn::{matmul::RawExecutor, Cudnn, MatmulProblem};
use graphsafe::sys::DeviceSpan;
use std::sync::Arc;

fn exec_inside_a_capture(dnn: &Arc<Cudnn>, p: &MatmulProblem, spans: [DeviceSpan; 3], mut stream: Stream) -> graphsafe::Result<()> {
    let exec = RawExecutor::new(dnn, p, spans, DeviceSpan::empty(), &stream)?;
    let (_graph, ()) = stream.capture(CaptureMode::ThreadLocal, |_cap| {
        exec.call();
        Ok(())
    })?;
    Ok(())
}

fn main() {
    let _ = exec_inside_a_capture;
}

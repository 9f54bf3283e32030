// A workspace view bound in one (branded) capture cannot be given to an op of another capture:
// graph B would bake in memory that only graph A keeps alive.
use graphsafe::driver::{DeviceBuffer, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::testing::{SplitKShape, TestKernels};
use graphsafe::workspace::Workspace;

fn f(k: &TestKernels, a: &mut Stream, b: &mut Stream, ws: &mut Workspace, bufs: &[DeviceBuffer; 3]) -> graphsafe::Result<()> {
    let shape = SplitKShape { m: 128, k: 128, splits: 1 };
    a.capture(CaptureMode::ThreadLocal, |cap_a| {
        let w = cap_a.bind_workspace(ws)?;
        b.capture(CaptureMode::ThreadLocal, |cap_b| {
            let (x, y, z) = (cap_b.bind_buffer(&bufs[0])?, cap_b.bind_buffer(&bufs[1])?, cap_b.bind_buffer(&bufs[2])?);
            k.split_k_gemv_captured(&x, &y, &z, shape, &w, cap_b)
        })?;
        Ok(())
    })?;
    Ok(())
}

fn main() {}

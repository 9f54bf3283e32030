// A buffer view bound in one (branded) capture cannot be used by another capture.
use graphsafe::driver::{DeviceBuffer, Stream};
use graphsafe::graph::CaptureMode;

fn f(a: &mut Stream, b: &mut Stream, buf: &DeviceBuffer) -> graphsafe::Result<()> {
    a.capture(CaptureMode::ThreadLocal, |cap_a| {
        let v = cap_a.bind_buffer(buf)?;
        b.capture(CaptureMode::ThreadLocal, |cap_b| cap_b.memset_u8(&v, 0))?;
        Ok(())
    })?;
    Ok(())
}

fn main() {}

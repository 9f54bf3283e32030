// A CapturedWorkspace view has no method that grows or frees.
use graphsafe::driver::Stream;
use graphsafe::graph::CaptureMode;
use graphsafe::workspace::Workspace;

fn f(stream: &mut Stream, other: &Stream, ws: &mut Workspace) -> graphsafe::Result<()> {
    let mut cap = stream.begin_capture(CaptureMode::ThreadLocal)?;
    let w = cap.bind_workspace(ws)?;
    w.ensure_size(1 << 30, other)?;
    cap.end()?;
    Ok(())
}

fn main() {}

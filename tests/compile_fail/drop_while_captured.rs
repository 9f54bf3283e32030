// A bound workspace cannot be dropped (freed) while the capture is open.
use graphsafe::driver::Stream;
use graphsafe::graph::CaptureMode;
use graphsafe::workspace::Workspace;

fn f(stream: &mut Stream, mut ws: Workspace) -> graphsafe::Result<()> {
    let mut cap = stream.begin_capture(CaptureMode::ThreadLocal)?;
    let _w = cap.bind_workspace(&mut ws)?;
    drop(ws);
    cap.end()?;
    Ok(())
}

fn main() {}

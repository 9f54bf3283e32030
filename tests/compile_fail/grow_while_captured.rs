// Growing a workspace while it is bound to an open capture does not compile.
use graphsafe::driver::Stream;
use graphsafe::graph::CaptureMode;
use graphsafe::workspace::Workspace;

fn f(stream: &mut Stream, ws: &mut Workspace) -> graphsafe::Result<()> {
    let mut cap = stream.begin_capture(CaptureMode::ThreadLocal)?;
    let w = cap.bind_workspace(ws)?;
    let _ = w.capacity();
    ws.ensure_size(1 << 30, stream)?;
    cap.end()?;
    Ok(())
}

fn main() {}

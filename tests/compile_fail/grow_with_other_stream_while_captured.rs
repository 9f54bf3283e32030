// Even with another stream, the bound workspace stays borrowed until the capture ends.
use graphsafe::driver::Stream;
use graphsafe::graph::CaptureMode;
use graphsafe::workspace::Workspace;

fn f(stream: &mut Stream, other: &Stream, ws: &mut Workspace) -> graphsafe::Result<()> {
    let mut cap = stream.begin_capture(CaptureMode::ThreadLocal)?;
    let _w = cap.bind_workspace(ws)?;
    ws.ensure_size(1 << 30, other)?;
    cap.end()?;
    Ok(())
}

fn main() {}

// A CapturedWorkspace view cannot be used after its workspace grows (its address would be stale).
use graphsafe::driver::Stream;
use graphsafe::graph::CaptureMode;
use graphsafe::workspace::Workspace;

fn f(stream: &mut Stream, other: &Stream, ws: &mut Workspace) -> graphsafe::Result<()> {
    let w = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal)?;
        let w = cap.bind_workspace(ws)?;
        cap.end()?;
        w
    };
    ws.ensure_size(1 << 30, other)?;
    let _ = w.device_ptr();
    Ok(())
}

fn main() {}

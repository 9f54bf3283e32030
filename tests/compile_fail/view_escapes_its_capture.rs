// A view cannot leave the capture that bound it (it would outlive the capture's borrow of the
// workspace, and could be handed to a later capture).
use graphsafe::driver::Stream;
use graphsafe::graph::CaptureMode;
use graphsafe::workspace::Workspace;

fn f(s: &mut Stream, ws: &mut Workspace) -> graphsafe::Result<()> {
    let (_graph, _view) = s.capture(CaptureMode::ThreadLocal, |cap| cap.bind_workspace(ws))?;
    Ok(())
}

fn main() {}

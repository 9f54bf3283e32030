// The capturing stream cannot be handed to eager APIs (which could allocate or grow inside it).
use graphsafe::driver::Stream;
use graphsafe::graph::CaptureMode;
use graphsafe::workspace::Workspace;

fn f(stream: &mut Stream) -> graphsafe::Result<()> {
    let cap = stream.begin_capture(CaptureMode::ThreadLocal)?;
    let _ws = Workspace::new(cap.stream(), 1 << 20)?;
    cap.end()?;
    Ok(())
}

fn main() {}

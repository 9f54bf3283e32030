// Opening cuDNN from a caller's list of candidates loads each file (running its initialisers) and
// calls its `cudnnGetVersion` with cuDNN's signature: any library, or a data symbol of that name,
// is undefined behaviour. So it is `unsafe`, as `Module::load` is (before, this compiled).
fn main() {
    let c = graphsafe::sys::cudnn::Candidate { source: "test", target: "/tmp/not-cudnn.so".into() };
    let _ = graphsafe::sys::cudnn::open_from(&[c]);
}

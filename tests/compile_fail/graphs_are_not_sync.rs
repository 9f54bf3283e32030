// CUDA graph objects are not internally synchronized: a Graph or GraphExec may move between
// threads but not be used from two at once.
fn sync<T: Sync>() {}

fn main() {
    sync::<graphsafe::graph::Graph>();
    sync::<graphsafe::graph::GraphExec>();
}

//! Raw FFI: the kernel glue in `cuda-src/` (bindgen over `include/graphsafe_kernels.h`), the CUDA
//! driver API types (bindgen over the toolkit's `cuda.h`), cuDNN, and the fatbins build.rs embeds.
//!
//! Both bindgen outputs are checked in; `--features bindgen` regenerates them and fails on drift.
//! Nothing in [`kernels`] is safe to call without reading the C header's contract; the crate calls
//! it only through `glue`, its safe wrappers (checked arguments in, `Result` out), which is where
//! the `unsafe` for the kernels and its justification live.

/// bindgen output for `include/graphsafe_kernels.h`; the header documents every item.
#[path = "kernels_bindings.rs"]
#[allow(missing_docs, unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, clippy::all)] // generated
pub mod kernels;

/// bindgen output for the toolkit's `cuda.h` and `cudaTypedefs.h`: types, constants, `PFN_` typedefs.
#[path = "cuda_bindings.rs"]
#[allow(missing_docs, unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, clippy::all)] // generated
pub mod cuda;

pub mod driver;

/// The CUDA runtime's `cudaError_t` names, for errors of the kernels' runtime.
pub mod cuda_errors;

/// `libcudnn.so.9` loaded at run time (lazy per symbol), its bindgen output (`cudnn::ffi`), and
/// safe RAII types over the backend API the ops use.
pub mod cudnn;

/// Safe wrappers of every kernel-glue function.
pub(crate) mod glue;

// The C signatures of the kernels in graphsafe's own fatbins, as checked launch arguments.
pub(crate) mod module_kernels;
pub(crate) mod process;
pub(crate) mod span;
pub use span::DeviceSpan;

/// Fatbins compiled from `cuda-src/` files marked `kind=fatbin`, for `driver::Module`.
/// Each is `None` when none of its archs was selected by `GRAPHSAFE_CUDA_ARCHS`.
pub mod modules {
    include!(concat!(env!("OUT_DIR"), "/modules.rs"));
}

/// One of the fatbins build.rs embedded ([`modules`]): complete and well-formed, so
/// `driver::Module::load_embedded` loads it without `unsafe`. Made only here, from those images.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fatbin {
    // Its `modules` name: what tells one image from another (a constant's bytes may be copied at
    // each use, so their address does not).
    name: &'static str,
    bytes: &'static [u8],
}

impl Fatbin {
    /// `cuda-src/testing/graph_safety.cu` (`None` where none of its archs was built).
    pub(crate) const TESTING_GRAPH_SAFETY: Option<Fatbin> = Fatbin::of("TESTING_GRAPH_SAFETY", modules::TESTING_GRAPH_SAFETY);
    /// `cuda-src/mla/reference.cu` (`None` where none of its archs was built).
    pub(crate) const MLA_REFERENCE: Option<Fatbin> = Fatbin::of("MLA_REFERENCE", modules::MLA_REFERENCE);

    const fn of(name: &'static str, image: Option<&'static [u8]>) -> Option<Fatbin> {
        match image {
            Some(bytes) => Some(Fatbin { name, bytes }),
            None => None,
        }
    }

    /// The image.
    pub(crate) fn bytes(self) -> &'static [u8] {
        self.bytes
    }

    /// Whether `other` is the same embedded image.
    pub(crate) fn same(self, other: Fatbin) -> bool {
        self.name == other.name
    }
}

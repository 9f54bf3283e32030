//! Size before capture (invariant 5): collect the workspace every captured kernel needs and pre-grow
//! once to the largest. Kernels on one stream run one after another and share the workspace, so
//! the largest single requirement is enough.

/// One kernel/shape's workspace need.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Requirement {
    /// What needs it, e.g. "mla bf16 batch 1 seq 2048".
    pub label: String,
    /// Bytes.
    pub bytes: u64,
}

/// Collects requirements from every op an engine will capture; [`WorkspacePlanner::bytes`] is the
/// size to pass to [`crate::workspace::Workspace::ensure_size`] before capturing.
///
/// ```
/// use graphsafe::ops::mla::{self, MlaArch, MlaLimits};
/// use graphsafe::ops::nvfp4::{self, Nvfp4Arch, Nvfp4Limits};
/// use graphsafe::workspace::WorkspacePlanner;
/// // One H200 decode step sharing one workspace: MLA attention and an NVFP4 projection.
/// let attn = mla::worst_case(MlaArch::Sm90, &MlaLimits::new(16, 64, 32_768, 132))?;
/// let proj = nvfp4::worst_case(Nvfp4Arch::Sm90, &Nvfp4Limits::new([1, 2, 4, 8, 16, 32, 64], 28_672, 8192, 132))?;
/// let mut planner = WorkspacePlanner::new();
/// planner.require("mla decode", attn.workspace_bytes).require("nvfp4 w4a16", proj.workspace_bytes);
/// assert_eq!(planner.len(), 2);
/// assert_eq!(planner.bytes(), attn.workspace_bytes.max(proj.workspace_bytes));
/// assert_eq!(planner.worst().unwrap().bytes, planner.bytes());
/// # Ok::<(), graphsafe::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct WorkspacePlanner {
    worst: Option<Requirement>,
    count: usize,
}

impl WorkspacePlanner {
    /// An empty plan (0 bytes).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one requirement.
    pub fn require(&mut self, label: impl Into<String>, bytes: u64) -> &mut Self {
        self.count += 1;
        if self.worst.as_ref().is_none_or(|w| bytes > w.bytes) {
            self.worst = Some(Requirement { label: label.into(), bytes });
        }
        self
    }

    /// The largest requirement so far, if any.
    pub fn worst(&self) -> Option<&Requirement> {
        self.worst.as_ref()
    }

    /// Bytes to pre-grow to (0 when nothing needs a workspace).
    pub fn bytes(&self) -> u64 {
        self.worst.as_ref().map_or(0, |w| w.bytes)
    }

    /// How many requirements were added.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

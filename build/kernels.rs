//! Compiling `cuda-src/**/*.cu` with nvcc: one object (or fatbin) per (file, arch set), cached by
//! content, compiled in parallel under a memory budget.
//!
//! Why not the `cc` crate: it has no content-addressed object cache (a CUTLASS sm_100f MLA
//! instantiation takes ~1 min and ~3.6 GB, so recompiling an unchanged file is not acceptable), it
//! cannot bound parallel jobs by memory, and it has no notion of per-file arch sets or of fatbins
//! that the driver loads at run time. We still use `cc` to find the archiver.
//!
//! Every `.cu` declares how it is built in a line near its top:
//!
//! ```text
//! // graphsafe-build: archs=mla:sm100 kind=object mem_mib=5500 cutlass_example=77_blackwell_fmha
//! ```
//!
//! * `archs`: the rows of the arch table (`src/arch_table.rs`) the file is built for, as a
//!   comma-separated list of selectors: `all` (every row: arch-neutral kernels), `mla:<back-end>`
//!   or `nvfp4:<back-end>` (every row whose back-end for that op it is: the file implements that
//!   back-end, so a new row with an existing back-end needs no directive change), or a row's name
//!   (`sm_90a`). Anything else is a one-line error. `host` means the file holds host code only
//!   (queries such as workspace sizes) and is compiled whatever GRAPHSAFE_CUDA_ARCHS says, so those
//!   queries exist on every build; it gets the lowest selected arch but instantiates no kernel.
//! * `kind`: `object` (linked into the crate as C functions) or `fatbin` (embedded in the crate and
//!   loaded by the driver layer with `cuModuleLoadData`).
//! * `mem_mib`: the peak memory of one compile, measured; used to bound parallel jobs.
//! * `cutlass_example`: a folder under CUTLASS's `examples/` to put on the include path.
//!
//! The cache (like ccache's direct mode, so it can never serve a stale object): key1 hashes the
//! source, the flags and the compiler's version; manifests under key1 list the headers a compile
//! read (one manifest per distinct list: two checkouts whose headers include different files keep
//! both, instead of evicting each other's); key2 hashes those headers' contents. The object is
//! stored under key1-key2.
//! A change to the source, a flag, the compiler or any header it includes gives a new key.
//!
//! Keys name the crate's own files by their path below the crate root (nvcc runs in the crate
//! root with relative paths), never by where the checkout lives, so every clone on a machine
//! shares every object; the toolchain and CUTLASS are named by their absolute paths, which are
//! the shared cache's own.

use crate::arch_table::{target_named, Op, SassCheck, EVERY_ROW_SASS, TARGETS};
use crate::provision::hex;
use crate::toolchain::{Cuda, Cutlass};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Object,
    Fatbin,
}

/// One `.cu` file and how to build it.
pub struct Unit {
    pub source: PathBuf,
    /// Path below cuda-src/, with '/' → '_' and no extension: names the fatbin constant.
    pub stem: String,
    pub kind: Kind,
    /// Archs to build for, after narrowing by GRAPHSAFE_CUDA_ARCHS. Empty: skip the file.
    pub archs: Vec<String>,
    /// Every row the directive selects, before narrowing (what a skipped unit would have had).
    pub supported: Vec<String>,
    /// The `op:back-end` selectors of the directive (`mla:sm100`): the back-ends it implements.
    pub backends: Vec<String>,
    pub host_only: bool,
    pub mem_mib: u64,
    pub cutlass_example: Option<String>,
}

/// What the build produced.
pub struct Built {
    pub objects: Vec<PathBuf>,
    /// (stem, kind, archs, object or fatbin path) of every unit built: the build manifest.
    pub units: Vec<(String, Kind, Vec<String>, PathBuf)>,
    /// (stem, archs, fatbin path)
    pub fatbins: Vec<(String, Vec<String>, PathBuf)>,
    /// (stem, supported archs) of units skipped because none of their archs was selected.
    pub skipped: Vec<(String, Vec<String>)>,
    pub compiled: usize,
    pub cached: usize,
}

/// The archs GRAPHSAFE_CUDA_ARCHS selects (build/inputs.rs checks the value).
pub fn selected_archs() -> Result<Vec<String>, String> {
    crate::inputs::archs(std::env::var("GRAPHSAFE_CUDA_ARCHS").ok().as_deref())
}

pub fn scan(src_root: &Path, selected: &[String]) -> Result<Vec<Unit>, String> {
    let mut files = Vec::new();
    walk(src_root, &mut files);
    files.sort();
    let mut units = Vec::new();
    for source in files {
        let text = fs::read_to_string(&source).map_err(|e| format!("{}: {e}", source.display()))?;
        let directive = text
            .lines()
            .take(30)
            .find_map(|l| l.trim().strip_prefix("// graphsafe-build:"))
            .ok_or_else(|| {
                format!("{}: missing a `// graphsafe-build: archs=… kind=…` line near the top", source.display())
            })?;
        let mut kind = Kind::Object;
        let mut archs: Option<(Vec<String>, Vec<String>)> = None;
        let mut host_only = false;
        let mut mem_mib = 1000;
        let mut cutlass_example = None;
        for field in directive.split_whitespace() {
            let (k, v) = field
                .split_once('=')
                .ok_or_else(|| format!("{}: bad graphsafe-build field {field:?}", source.display()))?;
            match k {
                "archs" if v == "host" => host_only = true,
                "archs" => archs = Some(crate::inputs::directive_archs(v).map_err(|e| format!("{}: {e}", source.display()))?),
                "kind" => {
                    kind = match v {
                        "object" => Kind::Object,
                        "fatbin" => Kind::Fatbin,
                        _ => return Err(format!("{}: kind must be object or fatbin", source.display())),
                    }
                }
                "mem_mib" => mem_mib = v.parse().map_err(|_| format!("{}: bad mem_mib", source.display()))?,
                "cutlass_example" => cutlass_example = Some(v.to_string()),
                _ => return Err(format!("{}: unknown graphsafe-build field {k}", source.display())),
            }
        }
        let (chosen, supported, backends) = if host_only {
            if kind == Kind::Fatbin {
                return Err(format!("{}: a host-only file cannot be a fatbin", source.display()));
            }
            (selected.iter().take(1).cloned().collect(), Vec::new(), Vec::new())
        } else {
            let (supported, backends) = archs.ok_or_else(|| format!("{}: graphsafe-build needs archs=", source.display()))?;
            (selected.iter().filter(|a| supported.contains(a)).cloned().collect(), supported, backends)
        };
        let rel = source.strip_prefix(src_root).unwrap_or(&source);
        let stem = rel.with_extension("").to_string_lossy().replace(['/', '\\', '-', '.'], "_");
        units.push(Unit { source, stem, kind, archs: chosen, supported, backends, host_only, mem_mib, cutlass_example });
    }
    check_backends(&units, selected)?;
    Ok(units)
}

/// Every back-end a selected row names must have a unit that implements it (`archs=mla:sm100`):
/// else dispatch would offer a kernel the build never compiled, and linking would fail on its
/// glue symbol far from the cause.
fn check_backends(units: &[Unit], selected: &[String]) -> Result<(), String> {
    let implemented: Vec<String> = units.iter().flat_map(|u| u.backends.iter().cloned()).collect();
    match crate::inputs::missing_backend(selected, &implemented) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "cu") {
            out.push(p);
        }
    }
}

pub struct Ctx<'a> {
    pub cuda: &'a Cuda,
    pub cutlass: &'a Cutlass,
    pub manifest_dir: &'a Path,
    pub cache: &'a Path,
    pub out_dir: &'a Path,
}

fn flags(ctx: &Ctx, unit: &Unit) -> Vec<String> {
    let mut f: Vec<String> = vec![
        "-std=c++17".into(),
        "-O3".into(),
        "-DNDEBUG".into(),
        "--expt-relaxed-constexpr".into(),
        "-Xcompiler=-fPIC".into(),
        // CUTLASS host code may use exceptions-free paths only; keep the glue C-like at its surface.
        "-Xcudafe=--diag_suppress=177".into(),
        // The crate's own folders relative to the crate root (nvcc runs there): flags, and so the
        // cache key, are the same for every clone of the repository on this machine.
        "-Iinclude".into(),
        "-Icuda-src".into(),
        format!("-isystem={}", ctx.cutlass.root.join("include").display()),
        format!("-isystem={}", ctx.cutlass.root.join("tools/util/include").display()),
    ];
    if let Some(ex) = &unit.cutlass_example {
        f.push(format!("-I{}", ctx.cutlass.root.join("examples").join(ex).display()));
        // CUTLASS's examples include helpers from examples/common by bare name.
        f.push(format!("-I{}", ctx.cutlass.root.join("examples/common").display()));
    }
    for a in &unit.archs {
        // Every arch in a unit came from the table (`select`, `inputs::archs`).
        for g in target_named(a).map(|t| t.gencode).unwrap_or_default() {
            f.push(format!("-gencode={g}"));
        }
    }
    if unit.host_only {
        f.push("-DGRAPHSAFE_HOST_ONLY=1".into());
    }
    f
}

/// Content hashes of headers, shared between jobs (CUTLASS headers are read by most files).
#[derive(Default)]
struct HashCache(Mutex<HashMap<PathBuf, Option<String>>>);

impl HashCache {
    fn get(&self, p: &Path) -> Option<String> {
        if let Some(v) = self.0.lock().unwrap().get(p) {
            return v.clone();
        }
        let v = fs::read(p).ok().map(|b| hex(&Sha256::digest(&b)));
        self.0.lock().unwrap().insert(p.to_path_buf(), v.clone());
        v
    }
}

/// `deps` are as stored in a manifest: relative to the crate root for the crate's own headers,
/// absolute for the toolchain's and CUTLASS's.
fn key2_of(root: &Path, deps: &[PathBuf], hashes: &HashCache) -> Option<String> {
    let mut h = Sha256::new();
    for d in deps {
        h.update(d.to_string_lossy().as_bytes());
        h.update([0]);
        h.update(hashes.get(&root.join(d))?.as_bytes());
    }
    Some(hex(&h.finalize())[..32].to_string())
}

/// Parses a make-style dependency file written by `nvcc -MD -MF`.
fn parse_depfile(text: &str) -> Vec<PathBuf> {
    let joined = text.replace("\\\n", " ");
    let after = joined.split_once(": ").map(|(_, r)| r).unwrap_or("");
    after.split_whitespace().filter(|s| *s != "\\").map(PathBuf::from).collect()
}

enum Outcome {
    Cached(PathBuf),
    Compiled(PathBuf),
}

fn build_one(ctx: &Ctx, unit: &Unit, hashes: &HashCache) -> Result<Outcome, String> {
    let flags = flags(ctx, unit);
    let src_bytes = fs::read(&unit.source).map_err(|e| e.to_string())?;
    let rel_source = unit.source.strip_prefix(ctx.manifest_dir).unwrap_or(&unit.source).to_path_buf();
    let mut h = Sha256::new();
    h.update(format!("{:?}\0", unit.kind));
    h.update(rel_source.to_string_lossy().as_bytes());
    h.update([0]);
    h.update(&src_bytes);
    h.update([0]);
    for f in &flags {
        h.update(f.as_bytes());
        h.update([0]);
    }
    h.update(ctx.cuda.version_text.as_bytes());
    let key1 = hex(&h.finalize())[..32].to_string();
    let ext = if unit.kind == Kind::Fatbin { "fatbin" } else { "o" };
    let objdir = ctx.cache.join("objects");
    fs::create_dir_all(&objdir).map_err(|e| e.to_string())?;
    let prefix = format!("{key1}.");
    let manifests = fs::read_dir(&objdir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deps")));
    for m in manifests {
        let Ok(text) = fs::read_to_string(m.path()) else { continue };
        let deps: Vec<PathBuf> = text.lines().map(PathBuf::from).collect();
        if let Some(key2) = key2_of(ctx.manifest_dir, &deps, hashes) {
            let obj = objdir.join(format!("{key1}-{key2}.{ext}"));
            if obj.is_file() {
                return Ok(Outcome::Cached(obj));
            }
        }
    }

    // Compile into a private temp name, then rename: concurrent builds never see half a file.
    let tmp_base = objdir.join(format!(".{key1}-{}", std::process::id()));
    let tmp_obj = tmp_base.with_extension(ext);
    let tmp_dep = tmp_base.with_extension("d");
    let mut cmd = Command::new(&ctx.cuda.nvcc);
    cmd.current_dir(ctx.manifest_dir);
    cmd.args(&flags);
    cmd.arg(if unit.kind == Kind::Fatbin { "-fatbin" } else { "-c" });
    cmd.arg(&rel_source).arg("-o").arg(&tmp_obj).arg("-MD").arg("-MF").arg(&tmp_dep);
    let out = cmd.output().map_err(|e| format!("running nvcc: {e}"))?;
    if !out.status.success() {
        let _ = fs::remove_file(&tmp_obj);
        let _ = fs::remove_file(&tmp_dep);
        return Err(format!(
            "nvcc failed on {}:\n{}\n{}",
            unit.source.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let dep_text = fs::read_to_string(&tmp_dep).map_err(|e| format!("reading nvcc depfile: {e}"))?;
    let _ = fs::remove_file(&tmp_dep);
    let root = fs::canonicalize(ctx.manifest_dir).map_err(|e| e.to_string())?;
    let source = fs::canonicalize(&unit.source).unwrap_or_default();
    let mut deps: Vec<PathBuf> = parse_depfile(&dep_text)
        .into_iter()
        .map(|p| fs::canonicalize(ctx.manifest_dir.join(&p)).unwrap_or(p))
        .filter(|p| p != &source)
        .map(|p| p.strip_prefix(&root).map(Path::to_path_buf).unwrap_or(p))
        .collect();
    deps.sort();
    deps.dedup();
    let key2 = key2_of(ctx.manifest_dir, &deps, hashes).ok_or("a header nvcc read has vanished")?;
    let obj = objdir.join(format!("{key1}-{key2}.{ext}"));
    fs::rename(&tmp_obj, &obj).map_err(|e| e.to_string())?;
    let list = deps.iter().map(|p| p.to_string_lossy().to_string()).collect::<Vec<_>>().join("\n");
    let manifest = objdir.join(format!("{key1}.{}.deps", &hex(&Sha256::digest(list.as_bytes()))[..16]));
    let tmp_manifest = tmp_base.with_extension("deps");
    fs::write(&tmp_manifest, &list).map_err(|e| e.to_string())?;
    fs::rename(&tmp_manifest, &manifest).map_err(|e| e.to_string())?;
    Ok(Outcome::Compiled(obj))
}

/// Available memory in MiB (MemAvailable), or a conservative guess.
fn available_mib() -> u64 {
    fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb / 1024)
        .unwrap_or(8 * 1024)
}

/// Compiles every unit that has archs, in parallel: at most NUM_JOBS at once, and never more at
/// once than fit in 90% of the memory available now (a single job that is larger than that still
/// runs, alone).
pub fn build_all(ctx: &Ctx, units: &[Unit]) -> Result<Built, String> {
    let threads: usize = std::env::var("NUM_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2))
        .max(1);
    let budget = available_mib() * 9 / 10;
    // Longest (largest) first, so the tail of the build is short jobs.
    let mut order: Vec<usize> = (0..units.len()).filter(|&i| !units[i].archs.is_empty()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(units[i].mem_mib));

    let queue = Mutex::new(order.iter().copied().collect::<VecDeque<usize>>());
    // (memory in use, jobs running)
    let gate = Arc::new((Mutex::new((0u64, 0usize)), Condvar::new()));
    let hashes = HashCache::default();
    let results: Mutex<HashMap<usize, Result<Outcome, String>>> = Mutex::new(HashMap::new());

    std::thread::scope(|s| {
        for _ in 0..threads.min(order.len().max(1)) {
            s.spawn(|| loop {
                let Some(i) = queue.lock().unwrap().pop_front() else { break };
                let need = units[i].mem_mib;
                {
                    let (lock, cv) = &*gate;
                    let mut g = lock.lock().unwrap();
                    while g.1 > 0 && g.0 + need > budget {
                        g = cv.wait(g).unwrap();
                    }
                    g.0 += need;
                    g.1 += 1;
                }
                let r = build_one(ctx, &units[i], &hashes);
                {
                    let (lock, cv) = &*gate;
                    let mut g = lock.lock().unwrap();
                    g.0 -= need;
                    g.1 -= 1;
                    cv.notify_all();
                }
                results.lock().unwrap().insert(i, r);
            });
        }
    });

    let mut results = results.into_inner().unwrap();
    let mut built = Built { objects: vec![], units: vec![], fatbins: vec![], skipped: vec![], compiled: 0, cached: 0 };
    let mut errors = Vec::new();
    for (i, unit) in units.iter().enumerate() {
        if unit.archs.is_empty() {
            built.skipped.push((unit.stem.clone(), unit.supported.clone()));
            continue;
        }
        match results.remove(&i) {
            Some(Ok(o)) => {
                let path = match o {
                    Outcome::Cached(p) => {
                        built.cached += 1;
                        p
                    }
                    Outcome::Compiled(p) => {
                        built.compiled += 1;
                        p
                    }
                };
                built.units.push((unit.stem.clone(), unit.kind, unit.archs.clone(), path.clone()));
                match unit.kind {
                    Kind::Object => built.objects.push(path),
                    Kind::Fatbin => {
                        let dest = ctx.out_dir.join(format!("{}.fatbin", unit.stem));
                        fs::copy(&path, &dest).map_err(|e| e.to_string())?;
                        built.fatbins.push((unit.stem.clone(), unit.archs.clone(), dest));
                    }
                }
            }
            Some(Err(e)) => errors.push(e),
            None => errors.push(format!("{}: not built", unit.source.display())),
        }
    }
    if !errors.is_empty() {
        return Err(errors.join("\n\n"));
    }
    Ok(built)
}

/// The symbols graphsafe's Rust code calls in the prelinked object: the kernel glue of
/// `include/graphsafe_kernels.h`. Every other symbol is made local.
pub const GLUE_PREFIX: &str = "gs_";

/// Links the kernel objects and the CUDA runtime they call into one relocatable object, makes
/// every symbol but the `gs_*` glue local, and archives it as OUT_DIR/libgraphsafe_kernels.a.
///
/// Why: archived as they were, the objects and `cudart_static` exported ~400 global `cuda*`
/// symbols (the runtime's API). Linked into a C++ engine that has a CUDA runtime of its own (any
/// version), the engine's `cudaMalloc` bound to graphsafe's copy, or graphsafe's kernels to the
/// engine's `libcudart.so`, whichever came first on the link line. After `ld -r`, every reference
/// from the kernels to the runtime is resolved inside the object, and once those symbols are local
/// the linker can bind nothing else to them, nor them to anything else.
///
/// `--force-group-allocation` dissolves the COMDAT groups (C++ inline and template code): a local
/// symbol left in a group could be discarded at the final link in favour of a same-named group of
/// the program's own, leaving the kernels' references to it dangling.
pub fn prelink(out_dir: &Path, objects: &[PathBuf], cuda_lib: &Path) -> Result<PathBuf, String> {
    let cudart = cuda_lib.join("libcudart_static.a");
    if !cudart.is_file() {
        return Err(format!("the CUDA runtime to link into the kernels is missing: {}", cudart.display()));
    }
    let linked = out_dir.join("graphsafe_kernels.linked.o");
    let object = out_dir.join("graphsafe_kernels.o");
    let run = |mut cmd: Command, what: &str| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("running {what} ({cmd:?}): {e} (GNU binutils is needed to build graphsafe)"))?;
        if !out.status.success() {
            return Err(format!("{what} failed ({cmd:?}):\n{}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(())
    };
    let mut ld = Command::new("ld");
    ld.arg("-r").arg("--force-group-allocation").arg("-o").arg(&linked).args(objects).arg(&cudart);
    run(ld, "ld -r (the kernels with cudart_static)")?;
    unique_to_global(&linked)?;
    let mut objcopy = Command::new("objcopy");
    objcopy.arg("--wildcard").arg(format!("--keep-global-symbol={GLUE_PREFIX}*")).arg(&linked).arg(&object);
    run(objcopy, "objcopy (making the CUDA runtime's symbols local)")?;
    let _ = fs::remove_file(&linked);
    let lib = out_dir.join("libgraphsafe_kernels.a");
    let _ = fs::remove_file(&lib);
    let mut ar = cc::Build::new().get_archiver();
    ar.arg("crs").arg(&lib).arg(&object);
    let st = ar.status().map_err(|e| format!("running ar: {e}"))?;
    if !st.success() {
        return Err("ar failed".into());
    }
    Ok(lib)
}

/// Rebinds the object's GNU_UNIQUE symbols as plain globals, in place, so that objcopy makes them
/// local with the rest (it localizes global and weak symbols, but leaves unique ones global).
///
/// g++ gives C++ inline variables and the static locals of inline functions that binding: libcu++'s
/// tag objects (`cuda::std::in_place`, `…::__cpo::begin`) and the like. Once their COMDAT groups
/// are dissolved, a global copy of ours would be a second definition beside a C++ engine's own
/// (which it uses too, through the CUDA headers of its own version): a multiple-definition link
/// error. Local, each program keeps its own. The symbol table's order (locals first) holds, since
/// unique symbols are already among the non-local ones.
fn unique_to_global(object: &Path) -> Result<(), String> {
    const STB_GLOBAL: u8 = 1;
    const STB_GNU_UNIQUE: u8 = 10;
    const SHT_SYMTAB: u32 = 2;
    let mut elf = fs::read(object).map_err(|e| format!("{}: {e}", object.display()))?;
    let bad = |what: &str| format!("{}: {what} (expected a 64-bit little-endian ELF relocatable object)", object.display());
    let u16_at = |b: &[u8], o: usize| b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]]) as usize);
    let u32_at = |b: &[u8], o: usize| b.get(o..o + 4).map(|s| u32::from_le_bytes(s.try_into().unwrap()));
    let u64_at = |b: &[u8], o: usize| b.get(o..o + 8).map(|s| u64::from_le_bytes(s.try_into().unwrap()) as usize);
    if elf.get(0..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        return Err(bad("not ELF64 LE"));
    }
    let shoff = u64_at(&elf, 0x28).ok_or_else(|| bad("no section headers"))?;
    let shentsize = u16_at(&elf, 0x3a).ok_or_else(|| bad("no section headers"))?;
    let shnum = u16_at(&elf, 0x3c).ok_or_else(|| bad("no section headers"))?;
    if shnum == 0 || shentsize < 0x40 {
        return Err(bad("an extended or empty section header table"));
    }
    let mut changed = 0;
    for i in 0..shnum {
        let sh = shoff + i * shentsize;
        if u32_at(&elf, sh + 4).ok_or_else(|| bad("truncated section header"))? != SHT_SYMTAB {
            continue;
        }
        let (off, size, entsize) = (u64_at(&elf, sh + 0x18), u64_at(&elf, sh + 0x20), u64_at(&elf, sh + 0x38));
        let (Some(off), Some(size), Some(24)) = (off, size, entsize) else { return Err(bad("a symbol table of unexpected layout")) };
        if off.checked_add(size).is_none_or(|end| end > elf.len()) {
            return Err(bad("a symbol table past the end of the file"));
        }
        for sym in (off..off + size).step_by(24) {
            let info = elf[sym + 4];
            if info >> 4 == STB_GNU_UNIQUE {
                elf[sym + 4] = (STB_GLOBAL << 4) | (info & 0xf);
                changed += 1;
            }
        }
    }
    if changed > 0 {
        fs::write(object, &elf).map_err(|e| format!("{}: {e}", object.display()))?;
    }
    Ok(())
}

/// OUT_DIR/modules.rs: one `Option<&[u8]>` per fatbin unit (None where its archs were not built).
pub fn write_modules_rs(out_dir: &Path, built: &Built, units: &[Unit]) -> Result<(), String> {
    let mut s = String::from("// Generated by build.rs: fatbins compiled from cuda-src/ (kind=fatbin).\n");
    for unit in units.iter().filter(|u| u.kind == Kind::Fatbin) {
        let name = unit.stem.to_uppercase();
        match built.fatbins.iter().find(|(stem, _, _)| stem == &unit.stem) {
            Some((_, archs, path)) => s.push_str(&format!(
                "/// `{}`, built for {}.\npub const {name}: Option<&[u8]> = Some(include_bytes!({:?}));\n",
                unit.source.file_name().unwrap().to_string_lossy(),
                archs.join(", "),
                path
            )),
            None => s.push_str(&format!(
                "/// `{}`: none of its archs was selected by GRAPHSAFE_CUDA_ARCHS.\npub const {name}: Option<&[u8]> = None;\n",
                unit.source.file_name().unwrap().to_string_lossy()
            )),
        }
    }
    fs::write(out_dir.join("modules.rs"), s).map_err(|e| e.to_string())
}

/// OUT_DIR/build-manifest.tsv: what `scripts/check-sass` checks, so it never parses Rust. One
/// `target` line per table row (name, selected or not, then `<op>=<back-end>` for each op of
/// `Op::WITH_BACKENDS`, `-` for none); one `sass` line per SASS requirement of each row (row, the
/// back-end's `op:back-end` selector or `all`, what, kernel pattern, minimum count, 1 if each
/// needs tensor-core MMA: `Backend::sass` and `EVERY_ROW_SASS` of the table); then one `unit`
/// line per unit built (stem, kind, `host` or its archs, the object or fatbin).
pub fn write_manifest(out_dir: &Path, selected: &[String], units: &[Unit], built: &Built) -> Result<(), String> {
    let mut s = String::from("# Generated by build.rs (build/kernels.rs): the arch table and every unit built.\n");
    for t in TARGETS {
        let on = if selected.iter().any(|a| a == t.name) { "selected" } else { "not-selected" };
        let columns: Vec<String> = Op::WITH_BACKENDS.iter().map(|&op| format!("{}={}", op.name(), t.backend(op).map_or("-", |b| b.name()))).collect();
        s.push_str(&format!("target\t{}\t{on}\t{}\n", t.name, columns.join("\t")));
    }
    let sass_line = |row: &str, by: &str, c: &SassCheck| format!("sass\t{row}\t{by}\t{}\t{}\t{}\t{}\n", c.what, c.kernel, c.min, u8::from(c.mma));
    for t in TARGETS {
        for b in t.backends {
            s.extend(b.sass().iter().map(|c| sass_line(t.name, &b.selector(), c)));
        }
        s.extend(EVERY_ROW_SASS.iter().map(|c| sass_line(t.name, "all", c)));
    }
    for (stem, kind, archs, path) in &built.units {
        let host = units.iter().any(|u| &u.stem == stem && u.host_only);
        let kind = if *kind == Kind::Fatbin { "fatbin" } else { "object" };
        let archs = if host { "host".to_string() } else { archs.join(",") };
        s.push_str(&format!("unit\t{stem}\t{kind}\t{archs}\t{}\n", path.display()));
    }
    fs::write(out_dir.join("build-manifest.tsv"), s).map_err(|e| e.to_string())
}

//! What the tuner measured, per adapter and class of shapes: kept for the process and,
//! natively, in a file per machine, so that only the first run on an adapter pays.

use super::super::tune::{MatmulChoice, MatmulClass, MatmulTuning};
use crate::kernels::matmul::MatmulKernel;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

impl MatmulClass {
    /// The shape measured for the class: the class's smallest size (32 under 64, 2,048 for the
    /// largest), within a factor of two of every shape it holds, so that kernels are ranked
    /// about where they will run; at most `largest` a side (a CPU adapter measures at 256, to
    /// take milliseconds).
    pub(super) fn representative(&self, largest: usize) -> [usize; 3] {
        self.dims.map(|c| [32, 64, 128, 256, 512, 1024, 2048][c as usize].min(largest))
    }

    /// The class in the cache file: `f32 128x256x256 a4 b4`.
    pub(super) fn key(&self, largest: usize) -> String {
        let [m, n, k] = self.representative(largest);
        let vec4 = |v: bool, name: &str| if v { format!(" {name}4") } else { String::new() };
        format!("{} {m}x{n}x{k}{}{}", self.dtype, vec4(self.vec4[0], "a"), vec4(self.vec4[1], "b"))
    }
}

/// A device's choices: the rule, what is known per class (None: being measured, on the web),
/// and the file that keeps them across runs.
pub(crate) struct Tuning {
    pub(super) choice: MatmulChoice,
    adapter: String,
    pub(super) known: FxHashMap<MatmulClass, Option<MatmulKernel>>,
    file: Option<PathBuf>,
    /// The largest side measured (see [`MatmulClass::representative`]).
    pub(super) largest: usize,
}

/// The cache file: per adapter (name, backend, driver), per class, the measurement.
#[derive(Debug, Default, Serialize, Deserialize)]
struct TuningFile {
    format: String,
    adapters: BTreeMap<String, BTreeMap<String, MatmulTuning>>,
}

/// 2: the staged kernels written out per tile (a file of format 1 never measured them).
const FILE_FORMAT: &str = "tensormem matmul tuning 2";

impl Tuning {
    pub fn new(choice: MatmulChoice, adapter: String, file: Option<PathBuf>, runs_on_cpu: bool) -> Tuning {
        let file = file.or_else(default_file);
        // In a browser the measurement runs beside the page, and the adapter may be a software
        // one that does not say so: it stays as cheap as on a CPU adapter.
        let largest = if runs_on_cpu || cfg!(target_arch = "wasm32") { 256 } else { 2048 };
        Tuning { choice, adapter, known: FxHashMap::default(), file, largest }
    }

    /// What the file says for this adapter and class, if it can be read and names a kernel.
    pub(super) fn remembered(&self, class: &MatmulClass) -> Option<MatmulKernel> {
        let file = read_file(self.file.as_ref()?)?;
        let tuning = file.adapters.get(&self.adapter)?.get(&class.key(self.largest))?;
        MatmulKernel::from_name(&tuning.kernel)
    }

    /// Adds a measurement to the file, keeping what other processes wrote meanwhile. A file
    /// that cannot be written costs the next run a measurement, nothing else.
    pub(super) fn remember(&self, class: &MatmulClass, tuning: &MatmulTuning) {
        let Some(path) = &self.file else { return };
        let mut file = read_file(path).unwrap_or_default();
        file.format = FILE_FORMAT.to_string();
        file.adapters.entry(self.adapter.clone()).or_default().insert(class.key(self.largest), tuning.clone());
        let Ok(text) = serde_json::to_string_pretty(&file) else { return };
        // Whole or not at all: devices on other threads or in other processes may write too.
        if let Some(folder) = path.parent() {
            let _ = std::fs::create_dir_all(folder);
        }
        let _ = crate::files::write_atomically(path, text.as_bytes());
    }
}

/// `matmul-kernels.json` in the cache folder ([`crate::files::cache_dir`]); none on the web,
/// where there are no files, nor with `TENSORMEM_CACHE=memory` (the MCP server's tools write
/// nothing).
fn default_file() -> Option<PathBuf> {
    if cfg!(target_arch = "wasm32") {
        return None;
    }
    file_named_by(|name| std::env::var_os(name))
}

/// The tuning file the environment `env` names (see [`default_file`]).
fn file_named_by(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    Some(crate::files::cache_dir_named_by(env)?.join("matmul-kernels.json"))
}

/// The file's contents; None when it is missing, unreadable, of another format or larger than
/// any cache this code writes (a link to `/dev/zero` is not read on): it will be rewritten.
fn read_file(path: &PathBuf) -> Option<TuningFile> {
    use std::io::Read;
    const LIMIT: u64 = 1 << 20;
    let mut bytes = Vec::new();
    std::fs::File::open(path).ok()?.take(LIMIT + 1).read_to_end(&mut bytes).ok()?;
    if bytes.len() as u64 > LIMIT {
        return None;
    }
    let file: TuningFile = serde_json::from_slice(&bytes).ok()?;
    (file.format == FILE_FORMAT).then_some(file)
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::dtype::DType;

    #[test]
    fn the_tuning_file_follows_the_environment_and_memory_keeps_it_off_disk() {
        let env = |pairs: &'static [(&'static str, &'static str)]| move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.into());
        assert_eq!(file_named_by(env(&[("HOME", "/h")])), Some(PathBuf::from("/h/.cache/tensormem/matmul-kernels.json")));
        assert_eq!(file_named_by(env(&[("HOME", "/h"), ("TENSORMEM_CACHE_DIR", "/c")])), Some(PathBuf::from("/c/matmul-kernels.json")));
        // What `tensormem mcp` sets for its tool calls: they write nothing.
        assert_eq!(file_named_by(env(&[("HOME", "/h"), ("TENSORMEM_CACHE_DIR", "/c"), ("TENSORMEM_CACHE", "memory")])), None);
        assert_eq!(file_named_by(env(&[("HOME", "/h"), ("TENSORMEM_CACHE", "off")])), None);
        // A folder named by TENSORMEM_CACHE comes before the older TENSORMEM_CACHE_DIR.
        assert_eq!(
            file_named_by(env(&[("HOME", "/h"), ("TENSORMEM_CACHE_DIR", "/c"), ("TENSORMEM_CACHE", "/d")])),
            Some(PathBuf::from("/d/matmul-kernels.json"))
        );
        assert_eq!(file_named_by(env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])), Some(PathBuf::from("/x/tensormem/matmul-kernels.json")));
    }

    #[test]
    fn classes_are_powers_of_two_measured_at_their_own_size_except_on_a_cpu_adapter() {
        let class = |n: usize| MatmulClass::new(DType::F32, n, n, n, true, true);
        let bounds = [(63, 0), (64, 1), (127, 1), (128, 2), (511, 3), (512, 4), (1023, 4), (1024, 5), (2047, 5), (2048, 6), (1 << 20, 6)];
        for (side, expected) in bounds {
            assert_eq!(class(side).dims, [expected; 3], "side {side}");
        }
        assert_eq!(class(300), class(500));
        // On an H100, staged64k16db leads at 1,024 and staged128k8db is 1.3x faster at 2,048.
        assert_ne!(class(1500), class(2048), "a 2048 product ranks kernels differently from a 1024 one");
        assert_eq!(class(2048), class(8192), "2,048 and more: one class");
        let measured = [class(300), class(1000), class(1500), class(2048), class(8192)].map(|c| c.representative(2048));
        assert_eq!(measured, [[256; 3], [512; 3], [1024; 3], [2048; 3], [2048; 3]], "each class at its smallest size");
        assert_eq!(class(8192).representative(256), [256; 3], "a CPU adapter measures in milliseconds");
        assert_eq!(class(2048).key(2048), "float32 2048x2048x2048 a4 b4");
        assert_eq!(class(2048).key(256), class(300).key(256), "on a CPU adapter the large classes share one measurement");
        assert!(!MatmulClass::new(DType::F32, 63, 4096, 4096, true, true).measured, "a thin product costs a dispatch whatever the kernel");
    }

    #[test]
    fn a_cache_that_is_an_endless_device_is_not_read_on() {
        assert!(read_file(&PathBuf::from("/dev/zero")).is_none());
    }
}

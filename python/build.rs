//! With the `page` feature (pyproject.toml turns it on, so every wheel and `pip install ./python`
//! has it): the web page's files copied into the package (tensormem/www), so that `tensormem
//! serve` works from the installed package alone. The page is the workspace's www/ with its wasm
//! build in www/pkg/; when that build is missing (a fresh clone), scripts/build-web.sh makes it
//! first, in a target folder of its own (the outer build holds target/'s lock). A page that
//! cannot be built is a warning, never a failed install: the command line and the API work
//! without it, and `tensormem serve` then says how to build it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::{env, fs};

fn main() {
    let here = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let workspace = here.join("..");
    let www = workspace.join("www");
    let package = here.join("tensormem/www");
    println!("cargo:rerun-if-changed={}", www.display());
    // The copy's wasm, not its folder: the script rewrites the folder on every run, which would
    // make cargo run it (and rebuild the crate) every time. The copies keep their sources'
    // times, so only a deleted or stale copy brings the script back.
    println!("cargo:rerun-if-changed={}", package.join("pkg/tensormem_bg.wasm").display());
    println!("cargo:rerun-if-changed=build.rs");
    if env::var_os("CARGO_FEATURE_PAGE").is_none() {
        return;
    }
    if let Some(e) = (!www.join("pkg/tensormem_bg.wasm").is_file()).then(|| build_page(&workspace).err()).flatten() {
        println!("cargo:warning=the page was not built ({e}): `tensormem serve` from this package will say how to build it");
        return;
    }
    if let Err(e) = copy_page(&www, &package) {
        println!("cargo:warning=the page's files were not copied into the package: {e}");
    }
}

/// scripts/build-web.sh, in an environment without the outer build's cargo variables (they would
/// steer the inner build: its target, profile, flags) and with a target folder of its own.
fn build_page(workspace: &Path) -> Result<(), String> {
    println!("cargo:warning=building the page's wasm (scripts/build-web.sh: a few minutes, once)");
    let mut command = Command::new("bash");
    command.arg(workspace.join("scripts/build-web.sh")).current_dir(workspace);
    for (name, _) in env::vars_os() {
        let name = name.to_string_lossy();
        let outer = (name.starts_with("CARGO") && name != "CARGO_HOME") || name.starts_with("RUST") && !name.starts_with("RUSTUP");
        if outer || ["TARGET", "HOST", "OUT_DIR", "PROFILE", "OPT_LEVEL", "DEBUG", "NUM_JOBS"].contains(&name.as_ref()) {
            command.env_remove(name.as_ref());
        }
    }
    command.env("CARGO_TARGET_DIR", workspace.join("target/page-build"));
    let status = command.status().map_err(|e| format!("bash: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("scripts/build-web.sh exited with {status}")) }
}

/// The page's own files (html, js, css) and the wasm build (pkg/tensormem.js, tensormem_bg.wasm),
/// written into a fresh folder beside the package's that then replaces it whole.
fn copy_page(www: &Path, package: &Path) -> Result<(), String> {
    let fresh = package.with_file_name("www.part");
    let _ = fs::remove_dir_all(&fresh);
    fs::create_dir_all(fresh.join("pkg")).map_err(|e| format!("{}: {e}", fresh.display()))?;
    let entries = fs::read_dir(www).map_err(|e| format!("{}: {e}", www.display()))?;
    let page =
        entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "html" || x == "js" || x == "css"));
    let wasm = ["pkg/tensormem.js", "pkg/tensormem_bg.wasm"].map(|f| www.join(f));
    for from in page.chain(wasm) {
        let to = fresh.join(from.strip_prefix(www).expect("inside www"));
        let failed = |e: std::io::Error| format!("{} -> {}: {e}", from.display(), to.display());
        fs::copy(&from, &to).map_err(failed)?;
        let modified = fs::metadata(&from).and_then(|m| m.modified()).map_err(failed)?;
        fs::File::options().write(true).open(&to).and_then(|f| f.set_modified(modified)).map_err(failed)?;
    }
    let _ = fs::remove_dir_all(package);
    fs::rename(&fresh, package).map_err(|e| format!("{} -> {}: {e}", fresh.display(), package.display()))
}

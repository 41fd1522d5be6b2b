//! Embeds the built web app (`web/dist`, made by `npm run build` in `web/`)
//! into the server when it is there; without it the server answers `/`
//! with a page that says how to build the app.
//!
//! Writes `$OUT_DIR/web_files.rs`: one `WebFile` per file of `web/dist`,
//! with its gzip twin (`name.gz`, written by the app's build) when there is
//! one. Only std: nothing is compressed or hashed here.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let web = manifest.join("../../web");
    let dist = web.join("dist");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it")).join("web_files.rs");

    let mut files = Vec::new();
    if dist.join("index.html").is_file() {
        // Cargo scans a directory's files for changes.
        println!("cargo:rerun-if-changed={}", dist.display());
        collect(&dist, &mut files);
    } else {
        // Not built: watch the app's folder so that the first build is
        // noticed (a path that does not exist would rerun this script, and
        // rebuild the server, on every build).
        println!("cargo:rerun-if-changed={}", web.display());
    }
    files.sort();

    let mut code = String::from(
        "/// The built web app's files, by URL path.\npub static FILES: &[WebFile] = &[\n",
    );
    for path in &files {
        let rel = path
            .strip_prefix(&dist)
            .expect("under dist")
            .to_string_lossy()
            .replace('\\', "/");
        if rel.ends_with(".gz") {
            continue;
        }
        let gz = PathBuf::from(format!("{}.gz", path.display()));
        let gzip = if files.contains(&gz) {
            format!("Some(include_bytes!({:?}))", gz.display().to_string())
        } else {
            "None".to_string()
        };
        let _ = writeln!(
            code,
            "    WebFile {{ path: {:?}, body: include_bytes!({:?}), gzip: {gzip} }},",
            format!("/{rel}"),
            path.display().to_string(),
        );
    }
    code.push_str("];\n");
    std::fs::write(&out, code).expect("write web_files.rs");
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, out);
        } else {
            out.push(path);
        }
    }
}

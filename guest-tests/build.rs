//! Per-bin linker scripts: every guest links with `link.ld` (64-bit entry `_start`), except
//! `mbtest`, which is a multiboot v1 kernel entered in 32-bit mode and uses `link-mb.ld`.

use std::path::Path;

/// Bins that boot through multiboot (32-bit protected-mode entry) instead of the 64-bit ELF contract.
const MULTIBOOT_BINS: &[&str] = &["mbtest"];

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let dir = Path::new(&dir);
    println!("cargo:rerun-if-changed=link.ld");
    println!("cargo:rerun-if-changed=link-mb.ld");
    println!("cargo:rerun-if-changed=src/bin");
    let bins = std::fs::read_dir(dir.join("src/bin")).expect("src/bin is readable");
    for entry in bins {
        let path = entry.expect("src/bin entry is readable").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let script = if MULTIBOOT_BINS.contains(&name) {
            "link-mb.ld"
        } else {
            "link.ld"
        };
        println!(
            "cargo:rustc-link-arg-bin={name}=-T{}",
            dir.join(script).display()
        );
        println!("cargo:rustc-link-arg-bin={name}=--no-pie");
    }
}

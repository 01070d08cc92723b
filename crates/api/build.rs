//! Finds whether the unit tests run as root, so that a test that needs root (changing
//! a file's owner) shows as ignored in the summary instead of passing without having
//! run (`#[cfg_attr(not(has_root), ignore = "...")]`). The tests run where they are
//! built (as `cargo test` does), so what holds here holds there.

use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(has_root)");
    if Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n")) {
        println!("cargo::rustc-cfg=has_root");
    }
}

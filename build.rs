//! Finds which preconditions of the end-to-end tests this machine meets, so that a
//! test whose precondition is missing shows as ignored in the summary instead of
//! passing without having run (`#[cfg_attr(not(has_root), ignore = "...")]`).
//!
//! The tests run where they are built (as `cargo test` does), so what holds here
//! holds there; a test that still finds its precondition missing fails, naming it.

use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=PATH");
    let found = [
        ("has_root", Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"))),
        ("has_mpirun", runs("mpirun")),
        ("has_nft", runs("nft")),
    ];
    for (name, present) in found {
        println!("cargo::rustc-check-cfg=cfg({name})");
        if present {
            println!("cargo::rustc-cfg={name}");
        }
    }
}

/// `program --version` runs and exits 0.
fn runs(program: &str) -> bool {
    Command::new(program).arg("--version").output().is_ok_and(|o| o.status.success())
}

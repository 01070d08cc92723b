//! Finds which tools the C tests need beyond a C compiler, so that a test whose tool
//! is missing shows as ignored in the summary instead of passing without having run.

use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=PATH");
    let found = [("has_valgrind", runs("valgrind")), ("has_cxx", runs("c++")), ("has_gxx", runs("g++"))];
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

//! The committed `include/treecast.h` is what cbindgen makes from this crate now: a
//! change to the C API that was not regenerated fails here.
//! `TREECAST_BLESS=1 cargo test -p treecast-capi --test header` rewrites it.

use std::path::Path;

#[test]
fn committed_header_matches_a_fresh_generation() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let committed_path = crate_dir.join("../../include/treecast.h");
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .unwrap_or_else(|e| panic!("crates/capi/cbindgen.toml: {e}"));
    let bindings = cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen cannot generate the header: {e}"));
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let fresh = String::from_utf8(fresh).unwrap_or_else(|e| panic!("cbindgen wrote non-UTF-8: {e}"));
    if std::env::var_os("TREECAST_BLESS").is_some() {
        std::fs::write(&committed_path, &fresh).unwrap_or_else(|e| panic!("writing include/treecast.h: {e}"));
        return;
    }
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/treecast.h is not what cbindgen makes from crates/capi now: regenerate it with \
         `TREECAST_BLESS=1 cargo test -p treecast-capi --test header` and commit it"
    );
}

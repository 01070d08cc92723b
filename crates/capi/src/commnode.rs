//! A C tool as its own comm node: started as `<program> node`, it runs the comm node
//! instead of its own code, so that it ships one program and needs no `treecast`
//! binary beside it (set `tc_network_options_set_treecast_path` to the program).

use crate::error::quiet;
use crate::ffi::block_on;

/// True when this process was started as a comm node (its first argument is
/// `node`): `main` should then return `tc_run_comm_node()` and do nothing else.
#[no_mangle]
pub extern "C" fn tc_started_as_comm_node() -> bool {
    quiet(false, treecast_api::started_as_comm_node)
}

/// Runs this process as a comm node until the tree ends; returns the exit status for
/// `main` (0, or 1 after printing why to stderr).
#[no_mangle]
pub extern "C" fn tc_run_comm_node() -> i32 {
    // This process is a comm node now, nothing else: a bug ends it at once, so that
    // its parent reports it lost, rather than leave a half-working node in the tree.
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        std::process::abort();
    }));
    quiet(1, || match block_on(treecast_api::run_comm_node()) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            eprintln!("treecast comm node: {e}");
            1
        }
        Err(f) => {
            eprintln!("treecast comm node: {}", f.message);
            1
        }
    })
}

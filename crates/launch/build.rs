//! Finds whether this machine has a route off loopback, so that the unit test that
//! needs one (an interface address is this machine) shows as ignored in the summary
//! instead of passing without having run (`#[cfg_attr(not(has_route), ignore = "...")]`).
//! The tests run where they are built (as `cargo test` does), so what holds here holds
//! there; connecting a UDP socket sends nothing.

use std::net::UdpSocket;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(has_route)");
    let routed = UdpSocket::bind("0.0.0.0:0").is_ok_and(|probe| probe.connect("192.0.2.1:9").is_ok());
    if routed {
        println!("cargo::rustc-cfg=has_route");
    }
}

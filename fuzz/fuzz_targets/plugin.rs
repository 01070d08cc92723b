//! The plug-in loader on arbitrary bytes: the ELF header check that runs before any
//! `dlopen`, and a loaded filter's host side (decoding a wave's payloads, their format
//! strings, checking what the filter emits up and down): they must return, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_filter::{Error, Filter, Output, Packet, Place, Value};
use treecast_filters::{FilterContext, FilterPlace, Transform};
use treecast_plugin::{check_elf, Plugin};
use treecast_wire::{Frame, FrameHeader};

/// Emits every packet's values up and down again.
struct Echo;

impl Filter for Echo {
    fn create(_: &[Value], _: &Place) -> Result<Self, Error> {
        Ok(Echo)
    }

    fn reduce(&mut self, wave: &[Packet<'_>], _: &Place, out: &mut Output<'_>) -> Result<(), Error> {
        for p in wave {
            let values = p.values()?;
            out.up(p.tag, &values)?;
            out.down(p.tag, &values)?;
        }
        Ok(())
    }
}

static TABLE: treecast_filter::abi::FilterTable = treecast_filter::table::<Echo>(c"echo", 1);

fuzz_target!(|data: &[u8]| {
    let _ = check_elf(data, "fuzz input");
    // SAFETY: a static table of this program, built by `treecast_filter::table`.
    let plugin = unsafe { Plugin::from_table(&TABLE, "echo".into()) }.expect("a valid table");
    let Ok(mut t) = plugin.instance(&[], &FilterPlace::default()) else { return };
    let half = data.len() / 2;
    let wave = vec![
        Frame::new(FrameHeader::data(1, 0, 3), data.to_vec()),
        Frame::new(FrameHeader::data(1, 0, 4), data[..half].to_vec()),
    ];
    let _ = t.apply(wave, &FilterContext { stream: 1, is_root: false });
    let _ = t.take_down();
    let _ = t.set_params(data);
});

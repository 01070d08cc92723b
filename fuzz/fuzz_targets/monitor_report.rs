//! A child's monitoring answer (`MonitorReport` JSON) as a comm node reads and merges
//! it: parsing and merging must return, never panic, and a merge that succeeds must
//! hold exactly the samples of the buckets it merged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_monitor::Collection;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(child) = Collection::from_json(text) else { return };
    // The merge rebuilds each histogram from its buckets; the counts a report claims
    // are not trusted.
    let buckets: Option<u64> = child
        .reports
        .values()
        .flat_map(|r| &r.cells)
        .flat_map(|c| &c.buckets)
        .try_fold(0u64, |sum, [_, count]| sum.checked_add(*count));
    let mut own = Collection::default();
    if own.absorb(child, Some(0)).is_ok() {
        if let (Ok(merged), Some(expected)) = (own.merged(), buckets) {
            assert_eq!(merged.count(), expected);
        }
    }
});

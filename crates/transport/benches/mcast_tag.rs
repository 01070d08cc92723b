//! What authenticating a multicast datagram costs: the tag the route uses
//! (HMAC-SHA-256, truncated) on a full 1472-byte datagram, against the keyed
//! BLAKE3 hash it was compared with. `cargo bench -p treecast-transport --bench mcast_tag`.

#![allow(missing_docs)] // criterion_group! makes an undocumented function

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use treecast_transport::mcast::McastKey;
use treecast_transport::Secret;
use treecast_wire::{encode_mcast, McastHeader};

fn tags(c: &mut Criterion) {
    let key = McastKey::new(&Secret::from_bytes([9; 32]));
    let mut datagram = Vec::new();
    encode_mcast(&McastHeader::data(1, 2, 3, 0, true, 4), &[0x5a; 1432], &mut datagram);
    let mut group = c.benchmark_group("mcast tag of a 1472-byte datagram");
    group.throughput(Throughput::Bytes(datagram.len() as u64));
    group.bench_function("hmac-sha256 (used)", |b| b.iter(|| key.sign(std::hint::black_box(&mut datagram))));
    let blake_key = [9u8; 32];
    group.bench_function("blake3 keyed (considered)", |b| {
        b.iter(|| blake3::keyed_hash(&blake_key, std::hint::black_box(&datagram[..datagram.len() - 16])))
    });
    group.finish();
}

criterion_group!(benches, tags);
criterion_main!(benches);

//! Decompression bombs against the real binary: 10 MB of zeros gzipped into
//! about 10 KB, eight at a time, are each refused with 413 after
//! `max_body_bytes` of decoded output, and the process's peak resident set
//! (`VmHWM`) grows by less than one inflated bomb.

#![allow(clippy::unwrap_used)]

use std::io::Write;

use skyport_tests::delivery_request;

use crate::spawn_skyport;

/// How much the peak RSS may grow over 64 bombs (eight inflated at once would be 80 MiB).
const BOUND_KIB: u64 = 8 * 1024;

fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bombs_are_refused_without_being_inflated() {
    let data = tempfile::tempdir().unwrap();
    let app = spawn_skyport(&data, &[], &[]).await;
    let pid = app.child.id().unwrap();
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(&vec![0_u8; 10 * 1024 * 1024]).unwrap();
    let bomb = bytes::Bytes::from(encoder.finish().unwrap());
    let send = |client: skyport_tests::Client, bomb: bytes::Bytes| async move {
        let response = client
            .http
            .post(format!("{}/api/deliveryrequests", client.base))
            .header("content-type", "application/json")
            .header("content-encoding", "gzip")
            .body(bomb)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 413);
    };

    // Warm up: connections, buffers and the allocator's first arenas.
    app.client.post_delivery(&delivery_request(1)).await;
    send(app.client.clone(), bomb.clone()).await;
    let before = peak_rss_kib(pid);
    for _ in 0..8 {
        let round: Vec<_> = (0..8)
            .map(|_| tokio::spawn(send(app.client.clone(), bomb.clone())))
            .collect();
        for bomb in round {
            bomb.await.unwrap();
        }
    }
    let after = peak_rss_kib(pid);
    println!(
        "64 bombs of {} bytes (10 MiB inflated): peak RSS {before} KiB -> {after} KiB",
        bomb.len()
    );
    assert!(
        after - before < BOUND_KIB,
        "the peak RSS grew {} KiB (bound {BOUND_KIB} KiB)",
        after - before
    );
    app.client.post_delivery(&delivery_request(2)).await;
    app.terminate().await;
}

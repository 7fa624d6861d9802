//! One target for every decoder: the input's first byte picks the decoder,
//! the rest is its input (`tests/src/decoders.rs`). Before the run, each
//! decoder's seeds go into the corpus, so the fuzzer starts from valid inputs.

#![no_main]

#[path = "../../src/decoders.rs"]
mod decoders;

use std::path::Path;

/// Writes every decoder's seeds into the corpus `cargo fuzz run decoders` reads.
fn seed_corpus() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/decoders");
    std::fs::create_dir_all(&corpus).expect("the corpus directory can be created");
    for (pick, decoder) in decoders::DECODERS.iter().enumerate() {
        for (n, seed) in (decoder.seeds)().into_iter().enumerate() {
            let mut input = vec![u8::try_from(pick).expect("fewer than 256 decoders")];
            input.extend(seed);
            std::fs::write(corpus.join(format!("seed-{}-{n}", decoder.name)), input)
                .expect("a seed can be written");
        }
    }
}

libfuzzer_sys::fuzz_target!(init: seed_corpus(), |bytes: &[u8]| {
    decoders::check_any(bytes);
});

//! Arbitrary bytes through the safetensors GPT-2 parser, with and without a
//! head count (the first byte of the input picks one).
#![no_main]

use host::model::Checkpoint;
use host::model::safetensors;
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let num_heads = data.first().map(|b| usize::from(*b) + 1);
    for nh in [None, num_heads] {
        if let Ok(w) = safetensors::parse(data, nh) {
            common::check_weights(&w);
        }
    }
    if let Ok(ck) = Checkpoint::from_bytes(data.to_vec(), "fuzz", num_heads) {
        common::check_weights(
            &ck.weights()
                .expect("a checkpoint that opened must parse again"),
        );
    }
});

//! Arbitrary bytes through the llm.c parser and format detection; also with a
//! valid magic and version patched in, so the fuzzer reaches the size checks.
#![no_main]

use host::model::checkpoint::parse_any;
use host::model::llmc;
use libfuzzer_sys::fuzz_target;

mod common;

/// Bytes of the magic and version fields.
const PATCH_LEN: usize = 8;

fuzz_target!(|data: &[u8]| {
    if let Ok((_, w)) = parse_any(data, None) {
        common::check_weights(&w);
    }
    if data.len() >= PATCH_LEN {
        let mut patched = data.to_vec();
        patched[..4].copy_from_slice(&llmc::MAGIC.to_le_bytes());
        // The input's first bit picks the dtype.
        let version = if data[0] & 1 == 0 {
            llmc::VERSION_F32
        } else {
            llmc::VERSION_BF16
        };
        patched[4..PATCH_LEN].copy_from_slice(&version.to_le_bytes());
        if let Ok(w) = llmc::parse(&patched) {
            common::check_weights(&w);
        }
    }
});

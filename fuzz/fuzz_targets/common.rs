//! Invariants every successfully parsed checkpoint must satisfy; a violation
//! aborts the fuzzer (a bug found).

use host::model::{Tensor, Weights};

fn check_tensor(t: &Tensor<'_>) {
    let len = t.shape[0]
        .checked_mul(t.shape[1])
        .expect("tensor size overflows");
    assert_eq!(
        t.bytes.len(),
        len * t.dtype.size(),
        "view length disagrees with shape"
    );
}

pub fn check_weights(w: &Weights<'_>) {
    let cfg = &w.config;
    assert!(cfg.channels > 0 && cfg.num_heads > 0 && cfg.channels % cfg.num_heads == 0);
    assert!(cfg.padded_vocab_size >= cfg.vocab_size);
    assert_eq!(w.layers.len(), cfg.num_layers);
    assert_eq!(w.wte.shape[1], cfg.channels);
    assert_eq!(w.wpe.shape, [cfg.max_seq_len, cfg.channels]);
    check_tensor(&w.wte);
    check_tensor(&w.wpe);
    check_tensor(&w.lnfw);
    check_tensor(&w.lnfb);
    for l in &w.layers {
        for t in [
            &l.ln1w,
            &l.ln1b,
            &l.qkvw,
            &l.qkvb,
            &l.attprojw,
            &l.attprojb,
            &l.ln2w,
            &l.ln2b,
            &l.fcw,
            &l.fcb,
            &l.fcprojw,
            &l.fcprojb,
        ] {
            check_tensor(t);
        }
        assert_eq!(l.qkvw.shape, [3 * cfg.channels, cfg.channels]);
        assert_eq!(l.fcprojw.shape, [cfg.channels, 4 * cfg.channels]);
    }
    // Converting the small tensors exercises the dtype/transposition paths.
    let _ = w.lnfw.to_f32();
    if let Some(l) = w.layers.first() {
        let _ = l.qkvb.to_f32();
    }
}

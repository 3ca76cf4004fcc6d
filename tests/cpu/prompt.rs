//! The prompt checks every program shares (`host::prompt`): their messages,
//! and `generate` failing on a bad prompt before any forward call.

use host::cpu::CpuModel;
use host::generate::generate;
use host::model::checkpoint::Checkpoint;
use host::model::fixtures::{llmc_bytes, tiny_config};
use host::model::{DType, ModelConfig};
use host::prompt::{PromptLimits, check_prompts, first_out_of_vocab, positions_needed};
use host::sample::{Sampler, SamplingParams};

const LIMITS: PromptLimits = PromptLimits {
    context: 8,
    vocab_size: 100,
};

fn err(prompts: &[Vec<u32>], limits: Option<PromptLimits>) -> String {
    check_prompts(prompts, limits).unwrap_err().to_string()
}

#[test]
fn bad_prompts_fail_with_messages_that_name_them_from_one() {
    assert_eq!(err(&[], None), "no prompt given");
    assert_eq!(err(&[vec![1], vec![]], None), "prompt 2 is empty");
    assert_eq!(err(&[vec![1], vec![]], Some(LIMITS)), "prompt 2 is empty");
    assert_eq!(
        err(&[vec![1; 9]], Some(LIMITS)),
        "prompt 1 is 9 tokens long, more than the context window of 8 tokens"
    );
    assert_eq!(
        err(&[vec![1], vec![3, 100, 101]], Some(LIMITS)),
        "prompt 2 has token 100, outside this model's vocabulary of 100"
    );
    // Before the model is known only the shape of the batch is checked.
    check_prompts(&[vec![1; 9], vec![100]], None).unwrap();
    check_prompts(&[vec![1; 8], vec![99]], Some(LIMITS)).unwrap();
}

#[test]
fn limits_and_positions_follow_the_model() {
    let config = ModelConfig::GPT2_124M;
    let limits = PromptLimits::of(&config);
    assert_eq!((limits.context, limits.vocab_size), (1024, 50257));
    let prompts = [vec![1; 5], vec![2; 12]];
    assert_eq!(positions_needed(&prompts, 10, 1024), 22);
    assert_eq!(positions_needed(&prompts, 2000, 1024), 1024);
    assert_eq!(positions_needed(&prompts, usize::MAX, 1024), 1024);
    assert_eq!(first_out_of_vocab(&[0, 99, 100, 7, 200], 100), Some((2, 100)));
    assert_eq!(first_out_of_vocab(&[0, 99], 100), None);
}

#[test]
fn generate_rejects_a_prompt_outside_the_vocabulary_up_front() {
    let cfg = tiny_config();
    let ckpt = Checkpoint::from_bytes(llmc_bytes(&cfg, 3, DType::F32).unwrap(), "tiny.bin", None).unwrap();
    let mut model = CpuModel::new(&ckpt.weights().unwrap(), 2, 16).unwrap();
    let mut s = Sampler::new(SamplingParams::GREEDY).unwrap();
    let v = cfg.vocab_size as u32;
    // The bad id sits past the shared prefill, where only a decode step
    // would have met it.
    let prompts = [vec![1, 2], vec![1, 2, 3, v]];
    let mut streamed = 0;
    let e = generate(&mut model, &prompts, 4, &mut s, |_, _| streamed += 1)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!("prompt 2 has token {v}, outside this model's vocabulary of {v}")
    );
    assert_eq!(streamed, 0, "no token may come before the check");
}

//! Helpers shared by the tests of this binary.

use std::path::{Path, PathBuf};

use rand::Rng;

/// A private scratch directory (`gpt2-<tag>-<pid>-<random>` in the system
/// temp dir), removed on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "gpt2-{tag}-{}-{:016x}",
            std::process::id(),
            rand::rng().random::<u64>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

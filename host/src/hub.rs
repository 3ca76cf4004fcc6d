//! Finding the GPT-2 checkpoint: an explicit path, the conventional local
//! file, or a download from the Hugging Face Hub into its usual cache
//! (`$HF_HOME/hub`, default `~/.cache/huggingface/hub`). User files are never
//! written: a download lives only in the hub cache.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};
use indicatif::ProgressBar;

/// The Hub repository of GPT-2 124M.
pub const DEFAULT_REPO: &str = "openai-community/gpt2";
/// Its checkpoint file.
pub const DEFAULT_FILE: &str = "model.safetensors";
/// Where a checkpoint placed by hand is looked for first.
pub const LOCAL_WEIGHTS: &str = "weights/gpt2/model.safetensors";
/// The public Hub, used when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// Environment variable naming another Hub endpoint (a mirror, or a test server).
pub const ENDPOINT_ENV: &str = "HF_ENDPOINT";
/// Environment variable naming the Hugging Face home (the cache is `$HF_HOME/hub`).
pub const HOME_ENV: &str = "HF_HOME";

/// Where to download from and where the cache is.
#[derive(Clone, Debug)]
pub struct HubOptions {
    pub endpoint: String,
    /// The hub cache directory (the `hub` folder, not `HF_HOME` itself).
    pub cache_dir: PathBuf,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

impl HubOptions {
    /// From `HF_ENDPOINT` and `HF_HOME`, like the Python `huggingface_hub`.
    pub fn from_env() -> HubOptions {
        let endpoint = std::env::var(ENDPOINT_ENV)
            .ok()
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        HubOptions {
            endpoint,
            cache_dir: Cache::from_env().path().clone(),
            progress: true,
        }
    }
}

/// The download URL of a file on the public Hub (for error messages).
pub fn file_url(endpoint: &str, repo: &str, file: &str) -> String {
    format!("{}/{repo}/resolve/main/{file}", endpoint.trim_end_matches('/'))
}

/// `file` of model repository `repo`: from the cache if present, else
/// downloaded into it. Errors explain how to get the file by hand.
pub fn fetch(repo: &str, file: &str, opts: &HubOptions) -> Result<PathBuf> {
    let hub_repo = Repo::new(repo.to_string(), RepoType::Model);
    let cache = Cache::new(opts.cache_dir.clone());
    if let Some(path) = cache.repo(hub_repo.clone()).get(file) {
        return Ok(path);
    }
    let api = ApiBuilder::from_cache(cache)
        .with_endpoint(opts.endpoint.clone())
        .with_progress(false)
        .build()
        .context("setting up the Hugging Face Hub client")?;
    eprintln!(
        "downloading {repo}/{file} from {} into {}",
        opts.endpoint,
        opts.cache_dir.display()
    );
    let progress = if opts.progress {
        ProgressBar::new(0)
    } else {
        ProgressBar::hidden()
    };
    match api.repo(hub_repo).download_with_progress(file, progress) {
        Ok(path) => Ok(path),
        Err(e) => bail!(
            "could not download {repo}/{file} from {endpoint}: {e}\n\
             Without network access: download {url} on another machine and put it at {LOCAL_WEIGHTS} \
             (or anywhere, and pass --weights PATH)",
            endpoint = opts.endpoint,
            url = file_url(DEFAULT_ENDPOINT, repo, file),
        ),
    }
}

/// The checkpoint to run: `explicit` if given (it must exist), else
/// [`LOCAL_WEIGHTS`] if present, else GPT-2 124M from the Hub.
pub fn resolve_weights(explicit: Option<&Path>, opts: &HubOptions) -> Result<PathBuf> {
    if let Some(path) = explicit {
        if !path.is_file() {
            bail!("weights file {} does not exist", path.display());
        }
        return Ok(path.to_path_buf());
    }
    let local = Path::new(LOCAL_WEIGHTS);
    if local.is_file() {
        return Ok(local.to_path_buf());
    }
    fetch(DEFAULT_REPO, DEFAULT_FILE, opts)
}

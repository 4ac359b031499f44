//! The durable registry in the data directory: content-addressed blobs (components, by
//! sha256) and each tenant's control-plane state (app versions and traffic set through the
//! API) as JSON. Every file lands atomically — written to a temp file, synced, renamed into
//! place, and the directory synced — so a process killed at any moment leaves the previous
//! file or the new one, never a torn one. Uploads stream into `tmp/` (cleared at start) and
//! become blobs only once complete and valid.
//!
//! With a shared store (`--store`, replicas), that store holds the control state and the
//! blobs; the data directory keeps blobs as a local cache (engines load files), filled from
//! the shared store on first use. [`Store::save_state`] writes the next version of a
//! tenant's document there, and says [`SaveError::Conflict`] when another replica wrote it
//! first; [`Store::newer_states`] hands over the versions this replica has not applied.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use futures::TryStreamExt;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::shared::{SharedError, SharedStore};

/// The data directory's registry part, and the shared store when replicas share one.
#[derive(Debug)]
pub struct Store {
    blobs: PathBuf,
    control: PathBuf,
    tmp: PathBuf,
    next_tmp: AtomicU64,
    shared: Option<SharedStore>,
    /// Per tenant, the version of its shared control document this replica serves.
    applied: Mutex<HashMap<String, u64>>,
}

/// Why a tenant's control state was not saved.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    /// Another replica wrote the next version first: apply it, then try again.
    #[error(transparent)]
    Conflict(SharedError),
    #[error(transparent)]
    Shared(SharedError),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A tenant's control document newer than the one this replica serves.
#[derive(Debug)]
pub struct NewerState {
    pub tenant: String,
    pub version: u64,
    pub document: Vec<u8>,
}

/// Why an upload stopped.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("the upload exceeds {max} bytes")]
    TooLarge { max: u64 },
    #[error("storing the upload failed: {0}")]
    Io(#[from] io::Error),
}

/// An upload in progress: bytes stream to a temp file and into the hash. Dropped before
/// [`Store::commit`], its temp file is removed.
#[derive(Debug)]
pub struct Upload {
    file: File,
    path: PathBuf,
    hasher: Sha256,
    length: u64,
    max: u64,
    finished: bool,
}

/// A complete upload, not yet a blob.
#[derive(Debug)]
pub struct Uploaded {
    pub sha256: String,
    pub length: u64,
    path: PathBuf,
}

impl Uploaded {
    pub fn read(&self) -> io::Result<Vec<u8>> {
        fs::read(&self.path)
    }
}

impl Drop for Uploaded {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

impl Upload {
    pub fn write(&mut self, chunk: &[u8]) -> Result<(), UploadError> {
        self.length += chunk.len() as u64;
        if self.length > self.max {
            return Err(UploadError::TooLarge { max: self.max });
        }
        self.hasher.update(chunk);
        self.file.write_all(chunk)?;
        Ok(())
    }

    /// Sync the bytes and name them by their digest.
    pub fn finish(mut self) -> Result<Uploaded, UploadError> {
        self.file.sync_all()?;
        self.finished = true;
        let sha256 = hex::encode(self.hasher.clone().finalize());
        Ok(Uploaded { sha256, length: self.length, path: self.path.clone() })
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        if !self.finished {
            let _ = fs::remove_file(&self.path);
        }
    }
}

impl Store {
    /// Open (creating) the store under `data_dir`, over `shared` when replicas share one;
    /// leftovers of interrupted uploads go.
    pub fn open(data_dir: &Path, shared: Option<SharedStore>) -> io::Result<Self> {
        let root = data_dir.join("registry");
        let store = Self {
            blobs: root.join("blobs").join("sha256"),
            control: root.join("control"),
            tmp: root.join("tmp"),
            next_tmp: AtomicU64::new(0),
            shared,
            applied: Mutex::new(HashMap::new()),
        };
        for dir in [&store.blobs, &store.control] {
            fs::create_dir_all(dir)?;
        }
        if store.tmp.exists() {
            fs::remove_dir_all(&store.tmp)?;
        }
        fs::create_dir_all(&store.tmp)?;
        Ok(store)
    }

    pub fn blob_path(&self, sha256: &str) -> PathBuf {
        self.blobs.join(sha256)
    }

    /// The size of a stored blob, if it is stored.
    pub fn blob_size(&self, sha256: &str) -> Option<u64> {
        fs::metadata(self.blob_path(sha256)).ok().map(|m| m.len())
    }

    #[cfg(test)]
    fn read_blob(&self, sha256: &str) -> io::Result<Vec<u8>> {
        fs::read(self.blob_path(sha256))
    }

    /// Remove a blob nothing references any more (a no-op when it is gone).
    pub fn remove_blob(&self, sha256: &str) -> io::Result<()> {
        match fs::remove_file(self.blob_path(sha256)) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
            _ => sync_dir(&self.blobs),
        }
    }

    /// Start an upload of at most `max` bytes.
    pub fn begin_upload(&self, max: u64) -> io::Result<Upload> {
        let path = self.temp_path("upload");
        let file = File::create(&path)?;
        Ok(Upload { file, path, hasher: Sha256::new(), length: 0, max, finished: false })
    }

    /// Make a complete upload a blob (a no-op when the blob exists).
    pub fn commit(&self, uploaded: &Uploaded) -> io::Result<PathBuf> {
        let target = self.blob_path(&uploaded.sha256);
        if !target.exists() {
            fs::rename(&uploaded.path, &target)?;
            sync_dir(&self.blobs)?;
        }
        Ok(target)
    }

    /// A tenant's control-plane state, if any was saved.
    #[cfg(test)]
    fn read_state<T: serde::de::DeserializeOwned>(&self, tenant: &str) -> io::Result<Option<T>> {
        let path = self.control.join(format!("{tenant}.json"));
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Tenants with saved control-plane state.
    pub fn saved_tenants(&self) -> io::Result<Vec<String>> {
        let mut tenants = Vec::new();
        for entry in fs::read_dir(&self.control)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if let Some(tenant) = name.strip_suffix(".json") {
                tenants.push(tenant.to_string());
            }
        }
        tenants.sort();
        Ok(tenants)
    }

    /// Replace a tenant's control-plane state atomically; a failed write leaves the previous
    /// state and no temp file.
    pub fn write_state<T: Serialize>(&self, tenant: &str, state: &T) -> io::Result<()> {
        let bytes = serde_json::to_vec_pretty(state).map_err(io::Error::other)?;
        let temp = self.temp_path("state");
        let written = File::create(&temp).and_then(|mut file| {
            file.write_all(&bytes)?;
            file.sync_all()
        });
        let replaced = written.and_then(|()| fs::rename(&temp, self.control.join(format!("{tenant}.json"))));
        if let Err(error) = replaced {
            let _ = fs::remove_file(&temp);
            return Err(error);
        }
        sync_dir(&self.control)
    }

    /// With a shared store, put a complete upload there as a blob (before any control
    /// document names it, and before [`Store::commit`] makes it one here).
    pub async fn share(&self, uploaded: &Uploaded) -> Result<(), SaveError> {
        match &self.shared {
            Some(shared) => shared.put_blob_file(&uploaded.sha256, &uploaded.path).await.map_err(SaveError::Shared),
            None => Ok(()),
        }
    }

    /// The local file of a blob, fetched from the shared store into the cache when missing
    /// (in parts, checked against its digest before it is used).
    pub async fn fetch_blob(&self, sha256: &str) -> Result<PathBuf, SaveError> {
        let path = self.blob_path(sha256);
        if path.exists() {
            return Ok(path);
        }
        let shared = self.shared.as_ref().ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "blob not stored"))?;
        let chunks = shared.blob_chunks(sha256).await.map_err(SaveError::Shared)?;
        let chunks = chunks.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "blob not in the shared store"))?;
        let temp = self.temp_path("fetch");
        let fetched = async {
            let mut chunks = std::pin::pin!(chunks);
            let mut file = tokio::fs::File::create(&temp).await?;
            let mut hasher = Sha256::new();
            while let Some(chunk) = chunks.try_next().await.map_err(SaveError::Shared)? {
                hasher.update(&chunk);
                file.write_all(&chunk).await?;
            }
            file.sync_all().await?;
            if hex::encode(hasher.finalize()) != sha256 {
                return Err(
                    io::Error::new(io::ErrorKind::InvalidData, "a shared blob does not match its digest").into()
                );
            }
            tokio::fs::rename(&temp, &path).await?;
            Ok(())
        };
        if let Err(error) = fetched.await {
            let _ = fs::remove_file(&temp);
            return Err(error);
        }
        Ok(path)
    }

    /// Save a tenant's control state: in the shared store as its next version, else in the
    /// data directory.
    pub async fn save_state<T: Serialize>(&self, tenant: &str, state: &T) -> Result<(), SaveError> {
        let Some(shared) = &self.shared else { return Ok(self.write_state(tenant, state)?) };
        let document = serde_json::to_vec_pretty(state).map_err(io::Error::other)?;
        let next = self.applied_version(tenant) + 1;
        match shared.write_control(tenant, next, document.into()).await {
            Ok(()) => {
                self.set_applied(tenant, next);
                Ok(())
            }
            Err(conflict @ SharedError::Conflict { .. }) => Err(SaveError::Conflict(conflict)),
            Err(error) => Err(SaveError::Shared(error)),
        }
    }

    /// Tenants' control documents this replica has not applied (all of them the first time),
    /// or `only` that tenant's; after applying one, the caller marks it with
    /// [`Store::set_applied`]. Without a shared store: the saved states in the data
    /// directory, as version 0.
    pub async fn newer_states(&self, only: Option<&str>) -> Result<Vec<NewerState>, SaveError> {
        let Some(shared) = &self.shared else {
            let mut newer = Vec::new();
            for tenant in self.saved_tenants()?.into_iter().filter(|t| only.is_none_or(|only| only == t)) {
                let path = self.control.join(format!("{tenant}.json"));
                newer.push(NewerState { document: fs::read(path)?, tenant, version: 0 });
            }
            return Ok(newer);
        };
        let mut newer = Vec::new();
        for (tenant, version) in shared.newest_versions(only).await.map_err(SaveError::Shared)? {
            if version > self.applied_version(&tenant) {
                let document = shared.read_control(&tenant, version).await.map_err(SaveError::Shared)?;
                newer.push(NewerState { tenant, version, document: document.to_vec() });
            }
        }
        Ok(newer)
    }

    /// The version of a tenant's shared control document this replica serves (0: none).
    pub fn applied_version(&self, tenant: &str) -> u64 {
        self.applied.lock().unwrap_or_else(PoisonError::into_inner).get(tenant).copied().unwrap_or(0)
    }

    /// Record that this replica serves `version` of a tenant's control document.
    pub fn set_applied(&self, tenant: &str, version: u64) {
        self.applied.lock().unwrap_or_else(PoisonError::into_inner).insert(tenant.to_string(), version);
    }

    fn temp_path(&self, kind: &str) -> PathBuf {
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        self.tmp.join(format!("{kind}-{}-{n}", std::process::id()))
    }
}

/// Sync a directory so a rename in it survives a crash.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uploads_become_content_addressed_blobs() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = Store::open(dir.path(), None).expect("opens");
        let mut upload = store.begin_upload(16).expect("begins");
        upload.write(b"hello ").expect("fits");
        upload.write(b"world").expect("fits");
        let uploaded = upload.finish().expect("finishes");
        assert_eq!(uploaded.sha256, hex::encode(Sha256::digest(b"hello world")));
        let path = store.commit(&uploaded).expect("commits");
        assert_eq!(fs::read(path).expect("blob"), b"hello world");
        assert_eq!(store.read_blob(&uploaded.sha256).expect("by digest"), b"hello world");
    }

    #[test]
    fn an_oversized_or_abandoned_upload_leaves_nothing() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = Store::open(dir.path(), None).expect("opens");
        let mut upload = store.begin_upload(4).expect("begins");
        assert!(matches!(upload.write(b"too long"), Err(UploadError::TooLarge { max: 4 })));
        drop(upload);
        let mut abandoned = store.begin_upload(100).expect("begins");
        abandoned.write(b"half").expect("fits");
        drop(abandoned);
        assert_eq!(fs::read_dir(&store.tmp).expect("tmp").count(), 0);
        assert_eq!(fs::read_dir(&store.blobs).expect("blobs").count(), 0);
    }

    #[test]
    fn state_round_trips_and_leftovers_are_cleared_on_open() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = Store::open(dir.path(), None).expect("opens");
        assert_eq!(store.read_state::<Vec<u32>>("acme").expect("reads"), None);
        store.write_state("acme", &vec![1u32, 2]).expect("writes");
        store.write_state("acme", &vec![3u32]).expect("replaces");
        assert_eq!(store.read_state::<Vec<u32>>("acme").expect("reads"), Some(vec![3]));
        fs::write(store.tmp.join("upload-crashed"), b"partial").expect("leftover");
        let reopened = Store::open(dir.path(), None).expect("reopens");
        assert_eq!(fs::read_dir(&reopened.tmp).expect("tmp").count(), 0, "an interrupted upload is cleared");
        assert_eq!(reopened.read_state::<Vec<u32>>("acme").expect("reads"), Some(vec![3]));
    }
}

//! The durable registry in the data directory: content-addressed blobs (components, by
//! sha256) and each tenant's control-plane state (app versions and traffic set through the
//! API) as JSON. Every file lands atomically — written to a temp file, synced, renamed into
//! place, and the directory synced — so a process killed at any moment leaves the previous
//! file or the new one, never a torn one. Uploads stream into `tmp/` (cleared at start) and
//! become blobs only once complete and valid.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

/// The data directory's registry part.
#[derive(Debug)]
pub struct Store {
    blobs: PathBuf,
    control: PathBuf,
    tmp: PathBuf,
    next_tmp: AtomicU64,
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
    /// Open (creating) the store under `data_dir`; leftovers of interrupted uploads go.
    pub fn open(data_dir: &Path) -> io::Result<Self> {
        let root = data_dir.join("registry");
        let store = Self {
            blobs: root.join("blobs").join("sha256"),
            control: root.join("control"),
            tmp: root.join("tmp"),
            next_tmp: AtomicU64::new(0),
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

    pub fn read_blob(&self, sha256: &str) -> io::Result<Vec<u8>> {
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
    pub fn read_state<T: DeserializeOwned>(&self, tenant: &str) -> io::Result<Option<T>> {
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
        let store = Store::open(dir.path()).expect("opens");
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
        let store = Store::open(dir.path()).expect("opens");
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
        let store = Store::open(dir.path()).expect("opens");
        assert_eq!(store.read_state::<Vec<u32>>("acme").expect("reads"), None);
        store.write_state("acme", &vec![1u32, 2]).expect("writes");
        store.write_state("acme", &vec![3u32]).expect("replaces");
        assert_eq!(store.read_state::<Vec<u32>>("acme").expect("reads"), Some(vec![3]));
        fs::write(store.tmp.join("upload-crashed"), b"partial").expect("leftover");
        let reopened = Store::open(dir.path()).expect("reopens");
        assert_eq!(fs::read_dir(&reopened.tmp).expect("tmp").count(), 0, "an interrupted upload is cleared");
        assert_eq!(reopened.read_state::<Vec<u32>>("acme").expect("reads"), Some(vec![3]));
    }
}

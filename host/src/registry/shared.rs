//! The store replicas share (`--store`): an object store, S3-compatible (`s3://bucket/prefix`,
//! credentials and endpoint from the standard AWS variables) or a directory (`file:///dir`),
//! through the `object_store` crate. It holds the blobs, by sha256 as in the data directory,
//! each tenant's control document, and under `telemetry/` what the replicas decide together
//! (`control::cluster`; its lease is [`super::lease`]).
//!
//! Control documents are versioned: `control/<tenant>/<sequence>.json`, and version n+1 is
//! written only if no one has written it yet (a conditional create: S3's `If-None-Match: *`, a
//! hard link in a directory; the one conditional write both support). Two replicas that
//! change the same tenant from version n both try n+1; one wins, the other is told
//! [`SharedError::Conflict`], reads the winner's version and tries again on it. No update is
//! lost and no lock is held. Listing `control/` tells each replica the newest sequence of
//! every tenant, which is how replicas notice each other's changes. Old versions beyond the
//! last [`KEPT_VERSIONS`] are deleted by their writer.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::buffered::BufWriter;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ClientConfigKey, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig};
use tokio::io::AsyncWriteExt;

/// Versions of a tenant's control document kept behind the newest (a replica reading while
/// another writes still finds the version it listed).
pub const KEPT_VERSIONS: u64 = 8;

/// The longest one operation on the store takes, retries included.
const STORE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Why the shared store refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum SharedError {
    #[error("{0}")]
    Url(String),
    #[error("version {sequence} of tenant '{tenant}' was written through another replica first")]
    Conflict { tenant: String, sequence: u64 },
    #[error("the shared store ({location}): {source}")]
    Store { location: String, source: object_store::Error },
    #[error("the shared store ({location}): {path}: {message}")]
    Invalid { location: String, path: String, message: String },
    #[error("'{key}' was created through another replica first")]
    Exists { key: String },
    #[error("the shared store ({location}): {source}")]
    Transfer { location: String, source: std::io::Error },
}

/// An object found by [`SharedStore::list`]: its key below the store's root and what tells
/// one version of it from the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub key: String,
    pub e_tag: Option<String>,
    pub last_modified_unix_ms: u64,
}

/// An opened shared store.
#[derive(Debug)]
pub struct SharedStore {
    objects: Arc<dyn ObjectStore>,
    root: ObjectPath,
    /// The `--store` URL, for messages (it holds no secret: credentials come from variables).
    location: String,
}

impl SharedStore {
    /// Open `file:///dir` (created if missing) or `s3://bucket[/prefix]`. S3 settings come
    /// from the standard variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_REGION`, `AWS_ENDPOINT_URL` for S3-compatible servers, `AWS_ALLOW_HTTP=true` for
    /// a plain-HTTP endpoint).
    pub fn open(url: &str) -> Result<Self, SharedError> {
        Self::open_with(url, &[])
    }

    /// [`SharedStore::open`] with S3 settings (`aws_endpoint`, `aws_access_key_id`, ...) that
    /// take precedence over the variables.
    pub fn open_with(url: &str, s3_settings: &[(&str, &str)]) -> Result<Self, SharedError> {
        let location = url.to_string();
        let store_error = |source| SharedError::Store { location: location.clone(), source };
        if let Some(dir) = url.strip_prefix("file://") {
            if !dir.starts_with('/') {
                return Err(SharedError::Url(format!("--store {url}: a file:// store needs an absolute path")));
            }
            std::fs::create_dir_all(dir).map_err(|e| SharedError::Url(format!("--store {url}: {e}")))?;
            let objects = LocalFileSystem::new_with_prefix(dir).map_err(store_error)?;
            return Ok(Self { objects: Arc::new(objects), root: ObjectPath::default(), location });
        }
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(SharedError::Url(format!("--store {url}: no bucket")));
            }
            // A store that does not answer fails a read in seconds, not after object_store's
            // default three minutes of retries: the replica serves on meanwhile.
            let retry = RetryConfig { max_retries: 2, retry_timeout: STORE_TIMEOUT, ..RetryConfig::default() };
            let mut builder = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_retry(retry)
                .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), "10s")
                .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout), "3s");
            for (key, value) in s3_settings {
                let key = key.parse().map_err(|e| SharedError::Url(format!("S3 setting '{key}': {e}")))?;
                builder = builder.with_config(key, *value);
            }
            let objects = builder.build().map_err(store_error)?;
            return Ok(Self { objects: Arc::new(objects), root: ObjectPath::from(prefix), location });
        }
        Err(SharedError::Url(format!("--store must be file:///DIR or s3://BUCKET[/PREFIX], not '{url}'")))
    }

    pub fn location(&self) -> &str {
        &self.location
    }

    fn error(&self, source: object_store::Error) -> SharedError {
        SharedError::Store { location: self.location.clone(), source }
    }

    fn key_path(&self, key: &str) -> ObjectPath {
        key.split('/').fold(self.root.clone(), |path, part| path.join(part))
    }

    /// An object's metadata as [`Listed`], its key relative to the root.
    fn listed(&self, meta: object_store::ObjectMeta) -> Option<Listed> {
        let parts: Vec<String> = meta.location.prefix_match(&self.root)?.map(|p| p.as_ref().to_string()).collect();
        Some(Listed {
            key: parts.join("/"),
            e_tag: meta.e_tag,
            last_modified_unix_ms: u64::try_from(meta.last_modified.timestamp_millis()).unwrap_or(0),
        })
    }

    /// Write (or replace) the object at `key`, a `/`-separated path below the store's root
    /// whose parts are ids the server validated. Returns its entity tag, where the store
    /// gives one.
    pub async fn put(&self, key: &str, bytes: Bytes) -> Result<Option<String>, SharedError> {
        let written = self.objects.put(&self.key_path(key), PutPayload::from(bytes)).await;
        written.map(|result| result.e_tag).map_err(|e| self.error(e))
    }

    /// Write the object at `key` only if there is none: [`SharedError::Exists`] otherwise.
    pub async fn create(&self, key: &str, bytes: Bytes) -> Result<Option<String>, SharedError> {
        let options = PutOptions { mode: PutMode::Create, ..Default::default() };
        match self.objects.put_opts(&self.key_path(key), PutPayload::from(bytes), options).await {
            Ok(result) => Ok(result.e_tag),
            Err(object_store::Error::AlreadyExists { .. }) => Err(SharedError::Exists { key: key.to_string() }),
            Err(source) => Err(self.error(source)),
        }
    }

    /// The object at `key`, or `None` when there is none.
    pub async fn get(&self, key: &str) -> Result<Option<Bytes>, SharedError> {
        match self.objects.get(&self.key_path(key)).await {
            Ok(found) => found.bytes().await.map(Some).map_err(|e| self.error(e)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(source) => Err(self.error(source)),
        }
    }

    /// The JSON document at `key`, or `None` when there is none; one that does not parse is
    /// [`SharedError::Invalid`].
    pub async fn get_json<T: serde::de::DeserializeOwned>(&self, key: &str) -> Result<Option<T>, SharedError> {
        let Some(bytes) = self.get(key).await? else { return Ok(None) };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| SharedError::Invalid {
            location: self.location.clone(),
            path: key.to_string(),
            message: e.to_string(),
        })
    }

    /// Every object below `prefix`, with keys relative to the store's root.
    pub async fn list(&self, prefix: &str) -> Result<Vec<Listed>, SharedError> {
        let listed: Vec<_> =
            self.objects.list(Some(&self.key_path(prefix))).try_collect().await.map_err(|e| self.error(e))?;
        Ok(listed.into_iter().filter_map(|meta| self.listed(meta)).collect())
    }

    /// What the store says of the object at `key` now, or `None` when there is none.
    pub async fn head(&self, key: &str) -> Result<Option<Listed>, SharedError> {
        match self.objects.head(&self.key_path(key)).await {
            Ok(meta) => Ok(self.listed(meta)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(source) => Err(self.error(source)),
        }
    }

    /// Delete the object at `key`; one already gone is no error.
    pub async fn delete(&self, key: &str) -> Result<(), SharedError> {
        match self.objects.delete(&self.key_path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(source) => Err(self.error(source)),
        }
    }

    /// Store a blob under its digest, from the file at `path`, in parts (a model is not held
    /// in memory whole). One stored already is written again (same digest, same bytes): its
    /// time is then the upload's, which keeps a sweep of unnamed blobs from deleting it before
    /// the control document that names it is written.
    pub async fn put_blob_file(&self, sha256: &str, path: &std::path::Path) -> Result<(), SharedError> {
        let transfer = |source| SharedError::Transfer { location: self.location.clone(), source };
        let mut file = tokio::fs::File::open(path).await.map_err(transfer)?;
        let mut writer = BufWriter::new(self.objects.clone(), self.key_path(&blob_key(sha256)));
        let copied = tokio::io::copy(&mut file, &mut writer).await;
        match copied {
            Ok(_) => writer.shutdown().await.map_err(transfer),
            Err(error) => {
                let _ = writer.abort().await;
                Err(transfer(error))
            }
        }
    }

    /// Store a blob held in memory (see [`SharedStore::put_blob_file`]).
    pub async fn put_blob(&self, sha256: &str, bytes: Bytes) -> Result<(), SharedError> {
        self.put(&blob_key(sha256), bytes).await.map(drop)
    }

    /// A blob's bytes in parts as they arrive, or `None` when it is not stored.
    pub async fn blob_chunks(
        &self,
        sha256: &str,
    ) -> Result<Option<impl futures::Stream<Item = Result<Bytes, SharedError>> + use<>>, SharedError> {
        let location = self.location.clone();
        match self.objects.get(&self.key_path(&blob_key(sha256))).await {
            Ok(found) => Ok(Some(
                found.into_stream().map_err(move |source| SharedError::Store { location: location.clone(), source }),
            )),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(source) => Err(self.error(source)),
        }
    }

    /// A blob's bytes, or `None` when it is not stored.
    pub async fn get_blob(&self, sha256: &str) -> Result<Option<Bytes>, SharedError> {
        self.get(&blob_key(sha256)).await
    }

    /// The newest version of every tenant's control document, or of `only` that tenant's.
    pub async fn newest_versions(&self, only: Option<&str>) -> Result<BTreeMap<String, u64>, SharedError> {
        let prefix = only.map_or_else(|| CONTROL.to_string(), |tenant| format!("{CONTROL}/{tenant}"));
        let mut newest = BTreeMap::new();
        for listed in self.list(&prefix).await? {
            let parts: Vec<&str> = listed.key.split('/').collect();
            let [CONTROL, tenant, file] = parts.as_slice() else { continue };
            let Some(sequence) = file.strip_suffix(".json").and_then(|s| s.parse::<u64>().ok()) else { continue };
            let entry = newest.entry(tenant.to_string()).or_insert(0);
            *entry = (*entry).max(sequence);
        }
        Ok(newest)
    }

    /// Version `sequence` of a tenant's control document.
    pub async fn read_control(&self, tenant: &str, sequence: u64) -> Result<Bytes, SharedError> {
        let found =
            self.objects.get(&self.key_path(&control_key(tenant, sequence))).await.map_err(|e| self.error(e))?;
        found.bytes().await.map_err(|e| self.error(e))
    }

    /// Write version `sequence` of a tenant's control document, only if no one has: otherwise
    /// [`SharedError::Conflict`]. Versions older than [`KEPT_VERSIONS`] behind it are deleted
    /// (best effort: one left behind is only space).
    pub async fn write_control(&self, tenant: &str, sequence: u64, document: Bytes) -> Result<(), SharedError> {
        match self.create(&control_key(tenant, sequence), document).await {
            Ok(_) => {}
            Err(SharedError::Exists { .. }) => {
                return Err(SharedError::Conflict { tenant: tenant.to_string(), sequence });
            }
            Err(error) => return Err(error),
        }
        if let Some(old) = sequence.checked_sub(KEPT_VERSIONS)
            && let Err(error) = self.delete(&control_key(tenant, old)).await
        {
            tracing::debug!(tenant, sequence = old, %error, "an old control version was not deleted");
        }
        Ok(())
    }
}

const CONTROL: &str = "control";

fn blob_key(sha256: &str) -> String {
    format!("blobs/sha256/{sha256}")
}

fn control_key(tenant: &str, sequence: u64) -> String {
    format!("{CONTROL}/{tenant}/{sequence:020}.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, SharedStore) {
        let dir = tempfile::tempdir().expect("tmp");
        let store = SharedStore::open(&format!("file://{}", dir.path().display())).expect("opens");
        (dir, store)
    }

    #[tokio::test]
    async fn a_version_is_written_once_and_the_second_writer_is_told() {
        let (_dir, store) = store();
        assert!(store.newest_versions(None).await.expect("lists").is_empty());
        store.write_control("acme", 1, Bytes::from_static(b"{\"a\":1}")).await.expect("first");
        let lost = store.write_control("acme", 1, Bytes::from_static(b"{\"a\":2}")).await;
        assert!(matches!(lost, Err(SharedError::Conflict { sequence: 1, .. })), "{lost:?}");
        assert_eq!(store.read_control("acme", 1).await.expect("reads").as_ref(), b"{\"a\":1}", "the winner stays");
        store.write_control("acme", 2, Bytes::from_static(b"{\"a\":3}")).await.expect("the next version");
        store.write_control("globex", 1, Bytes::from_static(b"{}")).await.expect("another tenant");
        let newest = store.newest_versions(None).await.expect("lists");
        assert_eq!(newest, BTreeMap::from([("acme".to_string(), 2), ("globex".to_string(), 1)]));
    }

    #[tokio::test]
    async fn old_versions_are_pruned_and_blobs_are_stored_once() {
        let (dir, store) = store();
        for sequence in 1..=KEPT_VERSIONS + 3 {
            store.write_control("acme", sequence, Bytes::from(sequence.to_string())).await.expect("writes");
        }
        let kept = std::fs::read_dir(dir.path().join("control/acme")).expect("dir").count() as u64;
        assert_eq!(kept, KEPT_VERSIONS, "the newest {KEPT_VERSIONS} versions are kept");
        assert_eq!(store.newest_versions(None).await.expect("lists")["acme"], KEPT_VERSIONS + 3);

        assert_eq!(store.get_blob("ab12").await.expect("reads"), None);
        store.put_blob("ab12", Bytes::from_static(b"weights")).await.expect("stores");
        store.put_blob("ab12", Bytes::from_static(b"weights")).await.expect("stored already: fine");
        assert_eq!(store.get_blob("ab12").await.expect("reads").as_deref(), Some(&b"weights"[..]));
    }

    #[test]
    fn only_file_and_s3_urls_open() {
        for bad in ["http://example.com/x", "file://relative/dir", "s3://", "gs://bucket"] {
            assert!(matches!(SharedStore::open(bad), Err(SharedError::Url(_))), "{bad}");
        }
    }
}

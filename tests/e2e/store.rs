//! The shared store on a real S3-compatible server (moto's server mode, started by the test
//! on a loopback port): blobs round-trip, and of many replicas writing the same version of a
//! tenant's control document at once exactly one wins — the conditional create the replicas'
//! no-lost-update rests on holds on S3, not only on a directory.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice::registry::shared::{SharedError, SharedStore};

use crate::support::*;

pub const MOTO: &str = "moto[server]==5.1.22";

/// A moto S3 server on a free loopback port, stopped on drop.
pub struct Moto {
    child: Child,
    pub endpoint: String,
}

impl Moto {
    pub async fn start() -> Self {
        let python = python_with(&[MOTO]);
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("port").port();
        let child = Command::new(python)
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts moto");
        let moto = Self { child, endpoint: format!("http://127.0.0.1:{port}") };
        let started = Instant::now();
        while reqwest::get(format!("{}/", moto.endpoint)).await.is_err() {
            assert!(started.elapsed() < Duration::from_secs(30), "moto did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        moto
    }

    /// Create a bucket (moto accepts unsigned requests).
    pub async fn bucket(&self, name: &str) {
        let created = reqwest::Client::new().put(format!("{}/{name}", self.endpoint)).send().await.expect("moto");
        assert!(created.status().is_success(), "bucket {name}: {}", created.status());
    }

    /// The S3 settings a client of this server needs.
    pub fn settings(&self) -> [(&'static str, &str); 5] {
        [
            ("aws_endpoint", self.endpoint.as_str()),
            ("aws_allow_http", "true"),
            ("aws_access_key_id", "testing"),
            ("aws_secret_access_key", "testing"),
            ("aws_region", "us-east-1"),
        ]
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn on_s3_one_of_many_concurrent_writers_of_a_version_wins() {
    let moto = Moto::start().await;
    moto.bucket("sluice").await;
    let store = Arc::new(SharedStore::open_with("s3://sluice/replicas", &moto.settings()).expect("opens"));

    store.put_blob("cafe", Bytes::from_static(b"weights")).await.expect("stores");
    store.put_blob("cafe", Bytes::from_static(b"weights")).await.expect("stored already: fine");
    assert_eq!(store.get_blob("cafe").await.expect("reads").as_deref(), Some(&b"weights"[..]));
    assert_eq!(store.get_blob("beef").await.expect("reads"), None);

    for sequence in 1..=3u64 {
        let writers: Vec<_> = (0..16)
            .map(|writer| {
                let store = store.clone();
                tokio::spawn(async move {
                    let document = Bytes::from(format!("{{\"writer\":{writer}}}"));
                    store.write_control("acme", sequence, document).await.map(|()| writer)
                })
            })
            .collect();
        let mut winners = Vec::new();
        for writer in writers {
            match writer.await.expect("joined") {
                Ok(writer) => winners.push(writer),
                Err(SharedError::Conflict { sequence: lost, .. }) => assert_eq!(lost, sequence),
                Err(other) => panic!("a writer failed otherwise: {other}"),
            }
        }
        assert_eq!(winners.len(), 1, "version {sequence}: exactly one writer wins, not {winners:?}");
        let stored = store.read_control("acme", sequence).await.expect("reads");
        assert_eq!(stored, Bytes::from(format!("{{\"writer\":{}}}", winners[0])), "the winner's document is stored");
    }
    assert_eq!(store.newest_versions().await.expect("lists").get("acme"), Some(&3));
}

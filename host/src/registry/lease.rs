//! A lease in the shared store: at most one replica at a time holds it, and when its holder
//! stops renewing it another takes it over. Built on the one conditional write every store
//! supports (create-if-absent, as the control documents are): the lease is a sequence of
//! terms, `<name>/<term>.json`, each naming its holder and when it expires. The holder renews
//! by writing the next term before its own expires; any replica that finds the newest term
//! expired writes the next one naming itself. Two that try the same term: one creates it,
//! the other is told it exists and does not hold the lease.
//!
//! A holder counts itself the holder only until `period` minus a margin after it began its
//! last successful write (its own monotonic clock), and others take over only after the
//! term's expiry by theirs: clocks may be a little apart, not by the margin.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::shared::{SharedError, SharedStore};

/// Terms kept behind the newest (older ones are deleted by the holder).
const KEPT_TERMS: u64 = 4;

/// One term, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Term {
    pub term: u64,
    pub holder: String,
    pub expires_unix_ms: u64,
}

/// One replica's side of a named lease.
#[derive(Debug)]
pub struct Lease {
    prefix: String,
    holder: String,
    period: Duration,
    /// The term this replica holds and until when (by its own clock).
    held: Option<(u64, Instant)>,
}

pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Lease {
    /// The lease stored under `prefix`, seen by the replica called `holder`; a term lasts
    /// `period`.
    pub fn new(prefix: &str, holder: &str, period: Duration) -> Self {
        Self { prefix: prefix.to_string(), holder: holder.to_string(), period, held: None }
    }

    /// Whether this replica holds the lease now.
    pub fn is_held(&self) -> bool {
        self.held_until().is_some_and(|until| Instant::now() < until)
    }

    /// Until when this replica holds the lease (by its own clock), if it does.
    pub fn held_until(&self) -> Option<Instant> {
        self.held.map(|(_, until)| until)
    }

    fn key(&self, term: u64) -> String {
        format!("{}/{term:020}.json", self.prefix)
    }

    /// One round: renew the lease if this replica holds it and half its term has passed,
    /// take it over if its term expired, else leave it. Returns whether this replica holds it.
    /// A store that fails leaves the lease held until its term runs out, no longer.
    pub async fn round(&mut self, store: &SharedStore) -> Result<bool, SharedError> {
        if let Some((_, until)) = self.held
            && until.saturating_duration_since(Instant::now()) > self.period / 2
        {
            return Ok(true);
        }
        let newest = self.newest(store).await?;
        let mine = newest.as_ref().is_some_and(|term| term.holder == self.holder);
        let expired = newest.as_ref().is_none_or(|term| term.expires_unix_ms < unix_ms());
        if !mine && !expired {
            self.held = None;
            return Ok(false);
        }
        // A term this replica wrote in an earlier life (same name) is renewed like its own.
        let next = newest.map_or(1, |term| term.term + 1);
        let began = Instant::now();
        let term = Term {
            term: next,
            holder: self.holder.clone(),
            expires_unix_ms: unix_ms() + self.period.as_millis() as u64,
        };
        let document = serde_json::to_vec(&term).expect("a term serializes");
        match store.create(&self.key(next), Bytes::from(document)).await {
            Ok(_) => {
                let margin = self.period / 5;
                self.held = Some((next, began + self.period - margin));
                if let Some(old) = next.checked_sub(KEPT_TERMS) {
                    let _ = store.delete(&self.key(old)).await;
                }
                Ok(true)
            }
            Err(SharedError::Exists { .. }) => {
                self.held = None;
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// The newest term written, if any.
    pub async fn newest(&self, store: &SharedStore) -> Result<Option<Term>, SharedError> {
        let listed = store.list(&self.prefix).await?;
        let Some(key) = listed.into_iter().map(|l| l.key).filter(|k| k.ends_with(".json")).max() else {
            return Ok(None);
        };
        store.get_json(&key).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_replica_holds_the_lease_and_another_takes_it_over_when_it_stops() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = SharedStore::open(&format!("file://{}", dir.path().display())).expect("opens");
        let period = Duration::from_millis(400);
        let mut first = Lease::new("leases/analysis", "r1", period);
        let mut second = Lease::new("leases/analysis", "r2", period);
        assert!(first.round(&store).await.expect("round"));
        assert!(!second.round(&store).await.expect("round"), "held by r1");
        // r1 renews while r2 keeps trying: r1 keeps it.
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(120)).await;
            assert!(first.round(&store).await.expect("round"));
            assert!(!second.round(&store).await.expect("round"));
        }
        assert!(first.is_held() && !second.is_held());
        // r1 stops: within two periods r2 holds it, and r1 (back) finds it taken.
        let stopped = Instant::now();
        while !second.round(&store).await.expect("round") {
            assert!(stopped.elapsed() < period * 2, "no takeover within two periods");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!first.is_held(), "r1's own clock ran its term out");
        assert!(!first.round(&store).await.expect("round"));
        let newest = second.newest(&store).await.expect("reads").expect("a term");
        assert_eq!(newest.holder, "r2");
        let terms = std::fs::read_dir(dir.path().join("leases/analysis")).expect("dir").count() as u64;
        assert!(terms <= KEPT_TERMS, "old terms are deleted: {terms}");
    }

    #[tokio::test]
    async fn of_replicas_racing_for_a_free_lease_one_wins() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = std::sync::Arc::new(SharedStore::open(&format!("file://{}", dir.path().display())).expect("opens"));
        let racers: Vec<_> = (0..8)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut lease = Lease::new("leases/x", &format!("r{i}"), Duration::from_secs(10));
                    lease.round(&store).await.expect("round")
                })
            })
            .collect();
        let mut holders = 0;
        for racer in racers {
            holders += usize::from(racer.await.expect("joins"));
        }
        assert_eq!(holders, 1);
    }
}

//! A token bucket: `rate` units a second, at most `burst` saved up. Used for what a tenant
//! may spend over time (log bytes, requests); one mutex-guarded pair of numbers per bucket.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(rate_per_second: f64, burst: f64) -> Self {
        let burst = burst.max(1.0);
        Self { rate: rate_per_second.max(0.0), burst, state: Mutex::new((burst, Instant::now())) }
    }

    /// Take `amount` if the bucket holds it (`Ok`); otherwise take nothing and say how long
    /// until it would (`Err`, the wait for a client's `Retry-After`).
    pub fn take(&self, amount: f64, now: Instant) -> Result<(), Duration> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (tokens, last) = &mut *state;
        *tokens = (*tokens + now.saturating_duration_since(*last).as_secs_f64() * self.rate).min(self.burst);
        *last = now.max(*last);
        if *tokens >= amount {
            *tokens -= amount;
            return Ok(());
        }
        let missing = amount.min(self.burst) - *tokens;
        Err(if self.rate > 0.0 { Duration::from_secs_f64(missing / self.rate) } else { Duration::MAX })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spends_the_burst_then_refills_at_the_rate() {
        let bucket = TokenBucket::new(10.0, 5.0);
        let start = Instant::now() + Duration::from_secs(1);
        for _ in 0..5 {
            assert_eq!(bucket.take(1.0, start), Ok(()));
        }
        let wait = bucket.take(1.0, start).expect_err("empty");
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        assert_eq!(bucket.take(1.0, start + Duration::from_millis(100)), Ok(()), "refilled one token");
        assert_eq!(bucket.take(3.0, start + Duration::from_secs(60)), Ok(()), "never more than the burst");
        assert!(bucket.take(3.0, start + Duration::from_secs(60)).is_err());
    }
}

//! Sliding-window rate limits per (slug, agent): a log of admitted call times
//! per key over the last `window_ms`. The limit is passed on every check
//! (`customRateLimit ?? rateLimit` of that agent), so agents never share one,
//! and the windows live apart from the registry, so reloading it keeps them.

use std::collections::{HashMap, VecDeque};

/// A refused call: the limit and when the oldest admitted call leaves the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateRefusal {
    pub limit: u32,
    pub retry_after_ms: u64,
}

/// The windows of every (slug, agent).
#[derive(Clone, Debug)]
pub struct RateLimiter {
    window_ms: u64,
    windows: HashMap<(String, String), VecDeque<u64>>,
    checks: u64,
}

/// Every this many checks, windows with nothing in them are dropped.
const SWEEP_EVERY: u64 = 4096;

impl RateLimiter {
    pub fn new(window_ms: u64) -> RateLimiter {
        RateLimiter { window_ms: window_ms.max(1), windows: HashMap::new(), checks: 0 }
    }

    /// Admits a call at `now_ms` (monotonic) unless `limit` calls were admitted in
    /// the window ending now; `None` or 0 is unlimited and records nothing.
    pub fn admit(&mut self, slug: &str, agent: &str, limit: Option<u32>, now_ms: u64) -> Result<(), RateRefusal> {
        let Some(limit) = limit.filter(|&n| n > 0) else {
            return Ok(());
        };
        self.checks += 1;
        if self.checks.is_multiple_of(SWEEP_EVERY) {
            let window = self.window_ms;
            self.windows.retain(|_, log| log.back().is_some_and(|&last| last + window > now_ms));
        }
        let key = (slug.to_string(), agent.to_string());
        admit_window(self.windows.entry(key).or_default(), limit, self.window_ms, now_ms)
    }

    /// How many keys hold a window.
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }
}

/// The one admission rule, on one window's log of admitted times (oldest
/// first): drops the times that left the window ending at `now_ms`, then admits
/// the call (appending `now_ms`) unless `limit` calls remain in it.
pub fn admit_window(log: &mut VecDeque<u64>, limit: u32, window_ms: u64, now_ms: u64) -> Result<(), RateRefusal> {
    let window_ms = window_ms.max(1);
    while log.front().is_some_and(|&t| t + window_ms <= now_ms) {
        log.pop_front();
    }
    if log.len() >= limit as usize {
        let oldest = log.front().copied().unwrap_or(now_ms);
        return Err(RateRefusal { limit, retry_after_ms: (oldest + window_ms).saturating_sub(now_ms) });
    }
    log.push_back(now_ms);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn limits_are_per_agent() {
        let mut limiter = RateLimiter::new(60_000);
        assert!(limiter.admit("s", "a", Some(2), 0).is_ok());
        assert!(limiter.admit("s", "a", Some(2), 1).is_ok());
        assert_eq!(limiter.admit("s", "a", Some(2), 2), Err(RateRefusal { limit: 2, retry_after_ms: 59_998 }));
        // Another agent with its own (custom) limit is not held back by a's.
        for t in 0..5 {
            assert!(limiter.admit("s", "b", Some(5), t).is_ok());
        }
        assert!(limiter.admit("s", "b", Some(5), 6).is_err());
        assert!(limiter.admit("s", "a", Some(2), 60_000).is_ok(), "the first call left the window");
        assert!(limiter.admit("s", "a", None, 60_001).is_ok());
    }

    proptest! {
        /// Decisions equal a naive model that keeps every admitted time, and no
        /// window of `window_ms` ever holds more admitted calls than the limit.
        #[test]
        fn matches_a_naive_model(steps in proptest::collection::vec((0u8..2, 0u8..3, 1u32..4, 0u64..400), 1..300)) {
            let window = 1000;
            let mut limiter = RateLimiter::new(window);
            let mut admitted: HashMap<(u8, u8), Vec<u64>> = HashMap::new();
            let mut now = 0;
            for (slug, agent, limit, dt) in steps {
                now += dt;
                let log = admitted.entry((slug, agent)).or_default();
                let live = log.iter().filter(|&&t| t + window > now).count();
                let expect = live < limit as usize;
                let got = limiter.admit(&slug.to_string(), &agent.to_string(), Some(limit), now).is_ok();
                prop_assert_eq!(got, expect);
                if got {
                    log.push(now);
                    let in_window = log.iter().filter(|&&t| t + window > now).count();
                    prop_assert!(in_window <= limit as usize);
                }
            }
        }
    }
}

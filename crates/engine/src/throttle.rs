//! Sign-in throttling, kept in the store so that every node counts the same
//! failures and no node holds shared mutable state.
//!
//! Two counters, each a window of failures:
//!
//! - per (account, client address): from [`PAIR_FAILURES`] on, every
//!   sign-in of that account from that address is slowed, the right
//!   password's too ([`sign_in_delay`]), until the window ends. The pair
//!   is not refused for it: an owner who mistyped still signs in, and
//!   failures from another address change nothing here.
//! - per client address: past [`ADDRESS_FAILURES`], on whatever accounts,
//!   every sign-in from it is refused until the window ends, whatever
//!   password it sends. This bounds the guesses (and password hashes) of
//!   one address, also those sent at once, which the delay does not: each
//!   reads the pair's count before any of them has added to it. (Clients
//!   behind one address share its count.) A failure is counted once its
//!   password is checked, so the sign-ins already past the check when the
//!   address's last allowed failure lands are checked too: the bound is
//!   that many more, at most the password hashers' queues.
//!
//! The client address is the caller's to determine (the server takes the
//! TCP peer, or the `X-Forwarded-For` entry left by a trusted proxy).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tarn_store::{Batch, Expect, Key, SnapshotExt};

use crate::error::{EngineError, Result};
use crate::schema::{self, THROTTLE};
use crate::Engine;

/// Failures per window of one account from one address from which its
/// sign-ins from there are slowed.
pub const PAIR_FAILURES: u32 = 5;
/// Failures allowed per window from one address, over all accounts.
pub const ADDRESS_FAILURES: u32 = 50;
const WINDOW_MICROS: i64 = 5 * 60 * 1_000_000;

#[derive(Serialize, Deserialize)]
struct Window {
    start: i64,
    failures: u32,
}

/// How long a sign-in waits before its password is checked, after
/// `failures` failed sign-ins of that account from that address in the
/// current window: nothing below [`PAIR_FAILURES`], then 25 ms doubling
/// with every failure up to `max` (half a second unless configured).
pub fn sign_in_delay(failures: u32, max: Duration) -> Duration {
    match failures.checked_sub(PAIR_FAILURES) {
        None => Duration::ZERO,
        Some(past) => (Duration::from_millis(25) * (1 << past.min(16))).min(max),
    }
}

fn key(what: &str) -> Key {
    Key::new(THROTTLE, what.as_bytes(), b"w".to_vec())
}

impl Engine {
    /// Refuses with [`EngineError::RateLimited`] if the address's window
    /// is full; answers the failures in the pair's window otherwise.
    async fn check_throttle(&self, pair: Option<&Key>, address: Option<&Key>) -> Result<u32> {
        let now = self.now();
        let gets: Vec<Key> = pair.into_iter().chain(address).cloned().collect();
        let mut rows = self.snapshot().await?.get_many(&gets).await?.into_iter();
        // The rows come in the order asked: the pair's, then the address's.
        let mut live = |asked: Option<&Key>| -> Result<Option<Window>> {
            let Some(row) = asked.and_then(|_| rows.next()).flatten() else {
                return Ok(None);
            };
            let w: Window = schema::decode("throttle window", &row)?;
            Ok((now - w.start < WINDOW_MICROS).then_some(w))
        };
        let pair_window = live(pair)?;
        if let Some(w) = live(address)? {
            if w.failures >= ADDRESS_FAILURES {
                let secs = (w.start + WINDOW_MICROS - now) / 1_000_000 + 1;
                return Err(EngineError::RateLimited {
                    detail: format!(
                        "too many failed sign-ins from this address; try again in {secs} s"
                    ),
                    retry_after: secs.max(1) as u64,
                });
            }
        }
        Ok(pair_window.map_or(0, |w| w.failures))
    }

    async fn record_failure(&self, key: &Key) -> Result<()> {
        self.retrying(|| async {
            let now = self.now();
            let row = self.snapshot().await?.get(key).await?;
            let (mut w, expect, version) = match &row {
                Some(r) => (
                    schema::decode::<Window>("throttle window", r)?,
                    Expect::Version(r.version),
                    r.version + 1,
                ),
                None => (
                    Window {
                        start: now,
                        failures: 0,
                    },
                    Expect::Absent,
                    1,
                ),
            };
            if now - w.start >= WINDOW_MICROS {
                w = Window {
                    start: now,
                    failures: 0,
                };
            }
            w.failures += 1;
            let mut b = Batch::new();
            b.put(key.clone(), schema::encode(&w), version)
                .guard(key.clone(), expect);
            self.store().write(b).await?;
            Ok(())
        })
        .await
    }

    /// [`Engine::sign_in`], slowed while this account has failed often from
    /// this client address ([`sign_in_delay`]), refused while the address
    /// has failed too often over all accounts; failures are counted, a
    /// success clears the account's count for the address.
    pub async fn sign_in_throttled(
        &self,
        username: &str,
        password: &str,
        client: Option<&str>,
    ) -> Result<(String, crate::User)> {
        self.throttled(username, client, || self.sign_in(username, password))
            .await
    }

    /// Runs `check`, a check of `username`'s password, counted and slowed
    /// as [`Engine::sign_in_throttled`] says: its
    /// [`EngineError::Unauthenticated`] is a failure.
    pub(crate) async fn throttled<T, F>(
        &self,
        username: &str,
        client: Option<&str>,
        check: impl FnOnce() -> F,
    ) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        let addr = client.unwrap_or("-");
        // A name no account can have fails like a wrong password, and
        // counts against its address all the same (it has no pair).
        let valid = crate::is_valid_name(username);
        let pair = valid.then(|| key(&format!("pair:{username}|{addr}")));
        let address = client.map(|_| key(&format!("addr:{addr}")));
        let failures = self
            .retrying(|| self.check_throttle(pair.as_ref(), address.as_ref()))
            .await?;
        tokio::time::sleep(sign_in_delay(failures, self.config().max_sign_in_delay)).await;
        let checked = if valid {
            check().await
        } else {
            Err(EngineError::Unauthenticated(
                "wrong username or password".into(),
            ))
        };
        match checked {
            Ok(ok) => {
                let Some(pair) = pair else { return Ok(ok) };
                let mut b = Batch::new();
                b.delete(pair);
                self.store()
                    .write(b)
                    .await
                    .map_err(|e| EngineError::from(e).settle())?;
                Ok(ok)
            }
            Err(EngineError::Unauthenticated(m)) => {
                for k in pair.iter().chain(&address) {
                    self.record_failure(k).await?;
                }
                Err(EngineError::Unauthenticated(m))
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_ins_are_slowed_from_the_pairs_fifth_failure_up_to_half_a_second() {
        let millis = |failures| sign_in_delay(failures, Duration::from_millis(500)).as_millis();
        assert_eq!(millis(0), 0);
        assert_eq!(millis(PAIR_FAILURES - 1), 0);
        assert_eq!(millis(PAIR_FAILURES), 25);
        assert_eq!(millis(PAIR_FAILURES + 1), 50);
        assert_eq!(millis(PAIR_FAILURES + 4), 400);
        assert_eq!(millis(PAIR_FAILURES + 5), 500);
        assert_eq!(millis(u32::MAX), 500);
    }
}

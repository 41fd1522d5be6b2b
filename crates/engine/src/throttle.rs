//! Sign-in throttling, kept in the store so that every node counts the same
//! failures and no node holds shared mutable state.
//!
//! Two counters, each a window of failures:
//!
//! - per (account, client address): past [`PAIR_FAILURES`] that address is
//!   refused for that account until the window ends. Another address is
//!   not affected, so nobody can lock an account's owner out by failing to
//!   sign in as them from elsewhere.
//! - per client address: past [`ADDRESS_FAILURES`] (an address trying many
//!   accounts), every sign-in from it is refused until the window ends,
//!   whatever password it sends.
//!
//! The client address is the caller's to determine (the server takes the
//! TCP peer, or the `X-Forwarded-For` entry left by a trusted proxy).

use serde::{Deserialize, Serialize};
use tarn_store::{Batch, Expect, Key, SnapshotExt};

use crate::error::{EngineError, Result};
use crate::schema::{self, THROTTLE};
use crate::Engine;

/// Failures allowed per window for one account from one address.
pub const PAIR_FAILURES: u32 = 10;
/// Failures allowed per window from one address, over all accounts.
pub const ADDRESS_FAILURES: u32 = 50;
const WINDOW_MICROS: i64 = 5 * 60 * 1_000_000;

#[derive(Serialize, Deserialize)]
struct Window {
    start: i64,
    failures: u32,
}

fn key(what: &str) -> Key {
    Key::new(THROTTLE, what.as_bytes(), b"w".to_vec())
}

impl Engine {
    /// Refuses with [`EngineError::RateLimited`] if one of the windows is
    /// full; answers the seconds left in it otherwise `None`.
    async fn check_throttle(&self, keys: &[(Key, u32)]) -> Result<()> {
        let now = self.now();
        let gets: Vec<Key> = keys.iter().map(|(k, _)| k.clone()).collect();
        let rows = self.snapshot().await?.get_many(&gets).await?;
        for ((_, limit), row) in keys.iter().zip(rows) {
            let Some(row) = row else { continue };
            let w: Window = schema::decode("throttle window", &row)?;
            if now - w.start < WINDOW_MICROS && w.failures >= *limit {
                let secs = (w.start + WINDOW_MICROS - now) / 1_000_000 + 1;
                return Err(EngineError::RateLimited {
                    detail: format!("too many failed sign-ins; try again in {secs} s"),
                    retry_after: secs.max(1) as u64,
                });
            }
        }
        Ok(())
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

    /// [`Engine::sign_in`], refused while this account has failed too often
    /// from this client address, or the address has failed too often over
    /// all accounts; failures are counted, a success clears the account's
    /// count for the address.
    pub async fn sign_in_throttled(
        &self,
        username: &str,
        password: &str,
        client: Option<&str>,
    ) -> Result<(String, crate::User)> {
        let addr = client.unwrap_or("-");
        // A name no account can have fails like a wrong password, and
        // counts against its address all the same (it has no pair).
        let valid = crate::is_valid_name(username);
        let pair = key(&format!("pair:{username}|{addr}"));
        let mut keys = Vec::new();
        if valid {
            keys.push((pair.clone(), PAIR_FAILURES));
        }
        if client.is_some() {
            keys.push((key(&format!("addr:{addr}")), ADDRESS_FAILURES));
        }
        self.retrying(|| self.check_throttle(&keys)).await?;
        let signed_in = if valid {
            self.sign_in(username, password).await
        } else {
            Err(EngineError::Unauthenticated(
                "wrong username or password".into(),
            ))
        };
        match signed_in {
            Ok(ok) => {
                let mut b = Batch::new();
                b.delete(pair);
                self.store()
                    .write(b)
                    .await
                    .map_err(|e| EngineError::from(e).settle())?;
                Ok(ok)
            }
            Err(EngineError::Unauthenticated(m)) => {
                for (k, _) in &keys {
                    self.record_failure(k).await?;
                }
                Err(EngineError::Unauthenticated(m))
            }
            Err(e) => Err(e),
        }
    }
}

//! Login throttling, kept in the store so that every node counts the same
//! failures and no node holds shared mutable state.
//!
//! Each key (a username, a client address) has a window of failures; past
//! the limit, sign-in is refused until the window ends.

use serde::{Deserialize, Serialize};
use tarn_store::{Batch, Expect, Key, Table};

use crate::error::{EngineError, Result};
use crate::schema;
use crate::Engine;

const THROTTLE: Table = Table::new("throttle");
/// Failures allowed per window for one username.
pub const USER_FAILURES: u32 = 10;
/// Failures allowed per window for one client address.
pub const ADDRESS_FAILURES: u32 = 50;
const WINDOW_MICROS: i64 = 5 * 60 * 1_000_000;

#[derive(Serialize, Deserialize)]
struct Window {
    start: i64,
    failures: u32,
}

fn key(kind: &str, id: &str) -> Key {
    Key::new(THROTTLE, format!("{kind}:{id}").into_bytes(), Vec::new())
}

impl Engine {
    /// Refuses with [`EngineError::RateLimited`] if the username or the
    /// address has failed too often lately.
    async fn check_throttle(&self, keys: &[(Key, u32)]) -> Result<()> {
        let now = self.now();
        let rows = self
            .store()
            .get_many(keys.iter().map(|(k, _)| k.clone()).collect())
            .await?;
        for ((_, limit), row) in keys.iter().zip(rows) {
            let Some(row) = row else { continue };
            let w: Window = schema::decode("throttle window", &row)?;
            if now - w.start < WINDOW_MICROS && w.failures >= *limit {
                let secs = (w.start + WINDOW_MICROS - now) / 1_000_000 + 1;
                return Err(EngineError::RateLimited(format!(
                    "too many failed sign-ins; try again in {secs} s"
                )));
            }
        }
        Ok(())
    }

    async fn record_failure(&self, key: &Key) -> Result<()> {
        self.retrying(|| async {
            let now = self.now();
            let row = self.store().get(key.clone()).await?;
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

    /// [`Engine::sign_in`], refused while the username or the client address
    /// has failed too often; failures are counted, a success clears the
    /// username's count.
    pub async fn sign_in_throttled(
        &self,
        username: &str,
        password: &str,
        client: Option<&str>,
    ) -> Result<(String, crate::User)> {
        if !crate::is_valid_name(username) {
            return Err(EngineError::Unauthenticated(
                "wrong username or password".into(),
            ));
        }
        let user_key = key("user", username);
        let mut keys = vec![(user_key.clone(), USER_FAILURES)];
        if let Some(addr) = client {
            keys.push((key("addr", addr), ADDRESS_FAILURES));
        }
        self.check_throttle(&keys).await?;
        match self.sign_in(username, password).await {
            Ok(ok) => {
                if self.store().get(user_key.clone()).await?.is_some() {
                    let mut b = Batch::new();
                    b.delete(user_key);
                    self.store().write(b).await?;
                }
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

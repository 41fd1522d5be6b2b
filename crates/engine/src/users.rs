//! Users, passwords and sessions.

use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use serde_json::{Map, Value};
use tarn_store::{Batch, Expect, Key, Scan, SnapshotExt};

use crate::actor::{invalid_session, session_hash, token_user};
use crate::error::{EngineError, Result};
use crate::model::{check_name, check_new_name};
use crate::schema::{self, SessionRow, USER_SESSIONS};
use crate::{b64, random_bytes, Caller, Engine, User};

/// Argon2id cost parameters.
#[derive(Clone, Copy, Debug)]
pub struct PasswordCost {
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Iterations.
    pub iterations: u32,
}

impl Default for PasswordCost {
    /// OWASP's recommended minimum for Argon2id: 19 MiB, 2 iterations.
    fn default() -> Self {
        PasswordCost {
            memory_kib: 19 * 1024,
            iterations: 2,
        }
    }
}

impl PasswordCost {
    /// The cheapest cost Argon2 allows, for tests only.
    pub fn for_tests() -> Self {
        PasswordCost {
            memory_kib: 8,
            iterations: 1,
        }
    }
}

/// A sign-up request.
#[derive(Clone, Debug)]
pub struct NewUser {
    /// The username.
    pub username: String,
    /// The password, at least 8 characters.
    pub password: String,
    /// Initial properties.
    pub properties: Map<String, Value>,
    /// Whether to make an administrator (administrators only).
    pub admin: bool,
}

/// The caller's own view of themselves.
#[derive(Clone, Debug)]
pub struct Me {
    /// The user.
    pub user: User,
    /// Every group the user belongs to, directly or through nesting.
    pub groups: Vec<String>,
}

const MIN_PASSWORD: usize = 8;
const MAX_PASSWORD: usize = 1024;

fn check_password(p: &str) -> Result<()> {
    let n = p.chars().count();
    if n < MIN_PASSWORD {
        return Err(EngineError::InvalidInput(format!(
            "the password needs at least {MIN_PASSWORD} characters"
        )));
    }
    if p.len() > MAX_PASSWORD {
        return Err(EngineError::InvalidInput(format!(
            "the password is longer than {MAX_PASSWORD} bytes"
        )));
    }
    Ok(())
}

/// A hasher's place, held while one hash runs.
struct HashSlot<'a> {
    _permit: tokio::sync::SemaphorePermit<'a>,
}

/// Who waits for a hasher. Each has a queue of its own, bounded alike, so
/// a flood of sign-ups (each hashing a new password) fills only theirs:
/// sign-ins still find places, and wait behind the sign-ups already queued
/// at most.
#[derive(Clone, Copy)]
enum Hashing {
    /// A sign-in's check (or the hash it spends on an unknown name).
    SignIn,
    /// A new password's hash: a sign-up, a password set.
    NewPassword,
}

impl Engine {
    /// Waits for a hasher, or refuses at once when too many of the same
    /// purpose wait already: past the queue's bound a request is answered
    /// `unavailable` (503 with `Retry-After`) instead of queueing for
    /// seconds.
    async fn hash_slot(&self, purpose: Hashing) -> Result<HashSlot<'_>> {
        let inner = &self.inner;
        if let Ok(p) = inner.hashing.try_acquire() {
            return Ok(HashSlot { _permit: p });
        }
        let queue = &inner.hash_waiting[purpose as usize];
        let waiting = queue.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _leave = scopeguard(|| {
            queue.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        });
        if waiting >= inner.config.password_queue {
            return Err(EngineError::Unavailable(match purpose {
                Hashing::SignIn => "too many sign-ins at once; try again shortly".into(),
                Hashing::NewPassword => "too many sign-ups at once; try again shortly".into(),
            }));
        }
        let permit = inner
            .hashing
            .acquire()
            .await
            .map_err(|e| EngineError::Internal(format!("hashing pool: {e}")))?;
        Ok(HashSlot { _permit: permit })
    }

    async fn hash_password(&self, password: &str, purpose: Hashing) -> Result<String> {
        let _slot = self.hash_slot(purpose).await?;
        let cost = self.inner.config.password_cost;
        let password = password.to_string();
        tokio::task::spawn_blocking(move || {
            let params = argon2::Params::new(cost.memory_kib, cost.iterations, 1, None)
                .map_err(|e| EngineError::Internal(format!("argon2 parameters: {e}")))?;
            let hasher =
                argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
            hasher
                .hash_password(password.as_bytes())
                .map(|h| h.to_string())
                .map_err(|e| EngineError::Internal(format!("argon2: {e}")))
        })
        .await
        .map_err(|e| EngineError::Internal(format!("hashing task: {e}")))?
    }

    async fn verify_password(&self, password: &str, hash: &str) -> Result<bool> {
        let _slot = self.hash_slot(Hashing::SignIn).await?;
        let password = password.to_string();
        let hash = hash.to_string();
        tokio::task::spawn_blocking(move || {
            argon2::Argon2::default()
                .verify_password(password.as_bytes(), hash.as_str())
                .is_ok()
        })
        .await
        .map_err(|e| EngineError::Internal(format!("hashing task: {e}")))
    }

    /// One user row, in a snapshot of its own.
    async fn read_user(&self, username: &str) -> Result<Option<(User, u64)>> {
        let mut snap = self.snapshot().await?;
        match snap.get(&schema::user_key(username)).await? {
            Some(row) => Ok(Some((schema::decode("user", &row)?, row.version))),
            None => Ok(None),
        }
    }

    /// Creates a user. `signup_open` says whether anyone may; otherwise only
    /// an administrator. Only an administrator may create an administrator.
    pub async fn create_user(
        &self,
        caller: &Caller,
        new: NewUser,
        signup_open: bool,
    ) -> Result<User> {
        // Who asks first (a token presented is checked, as everywhere),
        // then what is asked, and whether the name is free, before the
        // hash: a sign-up that will be refused costs no hasher.
        // (A name no user can have is never read as a key.)
        let named = check_new_name("username", &new.username);
        let keys: Vec<Key> = named
            .is_ok()
            .then(|| schema::user_key(&new.username))
            .into_iter()
            .collect();
        let (actor, taken) = self
            .retrying(|| async {
                let mut snap = self.snapshot().await?;
                let (actor, own) = match caller {
                    Caller::Anonymous => (None, crate::read(&mut snap, &keys, &[]).await?),
                    _ => {
                        let (actor, own) = self.resolve(&mut snap, caller, &keys, &[]).await?;
                        (Some(actor), own)
                    }
                };
                Ok((actor, own.rows.first().is_some_and(Option::is_some)))
            })
            .await?;
        if !signup_open || new.admin {
            actor
                .ok_or_else(|| EngineError::Unauthenticated("sign in as an administrator".into()))?
                .require_admin()?;
        }
        named?;
        check_password(&new.password)?;
        self.check_properties(&new.properties)?;
        if taken {
            return Err(taken_name(&new.username));
        }
        let hash = self
            .hash_password(&new.password, Hashing::NewPassword)
            .await?;
        let user = User {
            username: new.username,
            properties: new.properties,
            admin: new.admin,
            created_at: self.now(),
            password_hash: hash,
        };
        let mut b = Batch::new();
        let key = schema::user_key(&user.username);
        b.put(key.clone(), schema::encode(&user), 1)
            .guard(key, Expect::Absent);
        self.create_row(b, || taken_name(&user.username)).await?;
        Ok(user)
    }

    /// Makes sure the user `admin` exists with this password and the admin
    /// flag (for `TARN_ADMIN_PASSWORD`).
    pub async fn ensure_admin(&self, password: &str) -> Result<User> {
        check_password(password)?;
        if let Some((user, _)) = self.retrying(|| self.read_user("admin")).await? {
            if user.admin && self.verify_password(password, &user.password_hash).await? {
                return Ok(user);
            }
        }
        self.set_password("admin", password, Some(true), true).await
    }

    /// Sets a user's password (an administrator's action, also from the CLI),
    /// creating the user if `create` is set, and ends all their sessions.
    pub async fn set_password(
        &self,
        username: &str,
        password: &str,
        admin: Option<bool>,
        create: bool,
    ) -> Result<User> {
        check_name("username", username)?;
        check_password(password)?;
        let hash = self.hash_password(password, Hashing::NewPassword).await?;
        let user = self
            .retrying(|| async {
                let current = self.read_user(username).await?;
                let (mut user, expect, version) = match current {
                    Some((u, v)) => (u, Expect::Version(v), v + 1),
                    None if create => (
                        User {
                            username: username.to_string(),
                            properties: Map::new(),
                            admin: false,
                            created_at: self.now(),
                            password_hash: String::new(),
                        },
                        Expect::Absent,
                        1,
                    ),
                    None => return Err(EngineError::NotFound(format!("no user {username}"))),
                };
                user.password_hash = hash.clone();
                if let Some(a) = admin {
                    user.admin = a;
                }
                let mut b = Batch::new();
                let key = schema::user_key(username);
                b.put(key.clone(), schema::encode(&user), version)
                    .guard(key, expect);
                self.store().write(b).await?;
                Ok(user)
            })
            .await?;
        self.retrying(|| self.end_all_sessions(username)).await?;
        Ok(user)
    }

    /// An administrator sets another user's (or their own) password; every
    /// session of that user ends, on every node.
    pub async fn reset_password(
        &self,
        caller: &Caller,
        username: &str,
        password: &str,
    ) -> Result<User> {
        let actor = self
            .retrying(|| async {
                let mut snap = self.snapshot().await?;
                Ok(self.resolve(&mut snap, caller, &[], &[]).await?.0)
            })
            .await?;
        actor.require_admin()?;
        if !crate::is_valid_name(username) {
            return Err(EngineError::NotFound(format!("no user {username}")));
        }
        self.set_password(username, password, None, false).await
    }

    /// A user changes their own password, giving their current one: it is
    /// checked, slowed and counted as a sign-in's is (from `client`), and a
    /// wrong one is [`EngineError::Forbidden`] (not `Unauthenticated`: the
    /// caller's session is fine). Every other session of the user ends, on
    /// every node; the caller's own goes on.
    pub async fn change_own_password(
        &self,
        caller: &Caller,
        username: &str,
        current: &str,
        password: &str,
        client: Option<&str>,
    ) -> Result<User> {
        check_password(password)?;
        let actor = self
            .retrying(|| async {
                let mut snap = self.snapshot().await?;
                Ok(self.resolve(&mut snap, caller, &[], &[]).await?.0)
            })
            .await?;
        if actor.require_user()? != username {
            return Err(EngineError::Forbidden(
                "only your own password is changed with currentPassword; \
                 an administrator sets another user's without it"
                    .into(),
            ));
        }
        let wrong = || EngineError::Unauthenticated("the current password is wrong".into());
        let checked = self
            .throttled(username, client, || async {
                let (user, _) = self
                    .retrying(|| self.read_user(username))
                    .await?
                    .ok_or_else(wrong)?;
                if !self.verify_password(current, &user.password_hash).await? {
                    return Err(wrong());
                }
                Ok(user.password_hash)
            })
            .await;
        let checked = match checked {
            Err(EngineError::Unauthenticated(m)) => return Err(EngineError::Forbidden(m)),
            other => other?,
        };
        let hash = self.hash_password(password, Hashing::NewPassword).await?;
        // Guarded on the user row as read again: a reset or another password
        // change since the check wins, and this one is refused rather than
        // undo it; anything else changed meanwhile (properties) is kept.
        let key = schema::user_key(username);
        let user = self
            .retrying(|| async {
                let (mut user, version) = self
                    .read_user(username)
                    .await?
                    .ok_or_else(|| EngineError::NotFound(format!("no user {username}")))?;
                if user.password_hash != checked {
                    return Err(EngineError::Conflict(
                        "the password changed while it was checked; try again".into(),
                    ));
                }
                user.password_hash = hash.clone();
                let mut b = Batch::new();
                b.put(key.clone(), schema::encode(&user), version + 1)
                    .guard(key.clone(), Expect::Version(version));
                self.store().write(b).await?;
                Ok(user)
            })
            .await?;
        let keep = match caller {
            Caller::Token(token) => Some(session_hash(token)),
            _ => None,
        };
        self.retrying(|| self.end_sessions_but(username, keep))
            .await?;
        Ok(user)
    }

    /// Ends every session of a user, in bounded batches.
    pub(crate) async fn end_all_sessions(&self, username: &str) -> Result<()> {
        self.end_sessions_but(username, None).await
    }

    /// Ends every session of a user but the one whose token hashes to
    /// `keep`, in bounded batches.
    async fn end_sessions_but(&self, username: &str, keep: Option<[u8; 32]>) -> Result<()> {
        loop {
            let rows = {
                let mut snap = self.snapshot().await?;
                snap.scan(&Scan::partition(
                    USER_SESSIONS,
                    username.as_bytes().to_vec(),
                    500,
                ))
                .await?
            };
            let mut b = Batch::new();
            for r in rows {
                let hash: [u8; 32] = r
                    .clustering
                    .as_slice()
                    .try_into()
                    .map_err(|_| crate::error::corrupt("session entry", "length"))?;
                if Some(hash) != keep {
                    b.delete(schema::session_key(&hash));
                    b.delete(schema::user_session_key(username, &hash));
                }
            }
            if b.is_empty() {
                return Ok(());
            }
            self.store().write(b).await?;
        }
    }

    /// Checks a username and password and opens a session. Wrong username
    /// and wrong password answer the same. The token is
    /// `<username>.<secret>`; only its hash is stored.
    pub async fn sign_in(&self, username: &str, password: &str) -> Result<(String, User)> {
        let wrong = || EngineError::Unauthenticated("wrong username or password".into());
        let mut attempt = 0;
        loop {
            let Some((user, version)) = self.retrying(|| self.read_user(username)).await? else {
                // Spend the same time as a real check, so timing does not
                // tell which usernames exist.
                let _ = self.hash_password(password, Hashing::SignIn).await?;
                return Err(wrong());
            };
            if !self.verify_password(password, &user.password_hash).await? {
                return Err(wrong());
            }
            let token = format!("{}.{}", user.username, b64(&random_bytes::<32>()));
            let hash = session_hash(&token);
            let row = SessionRow {
                username: user.username.clone(),
                expires_at: self.now() + self.inner.config.session_ttl.as_micros() as i64,
            };
            // Guarded on the user row as read: a password reset that lands
            // between the check and this write (and ends every session it
            // finds) makes this write fail instead of leaving a session
            // opened with the old password.
            let user_key = schema::user_key(&user.username);
            let mut b = Batch::new();
            b.put(schema::session_key(&hash), schema::encode(&row), 1)
                .put(
                    schema::user_session_key(&user.username, &hash),
                    schema::MARK.to_vec(),
                    1,
                )
                .guard(user_key, Expect::Version(version));
            match self.store().write(b).await {
                Ok(()) => return Ok((token, user)),
                // The user row changed meanwhile (a new password, or only
                // new properties), or the write lost to a concurrent one
                // (a lightweight transaction under contention): check
                // again against what it is now.
                Err(
                    tarn_store::StoreError::GuardFailed { .. }
                    | tarn_store::StoreError::Conflict(_),
                ) if attempt < 2 => attempt += 1,
                Err(e) => return Err(EngineError::from(e).settle()),
            }
        }
    }

    /// Ends the session of this token on every node at once.
    pub async fn sign_out(&self, caller: &Caller) -> Result<()> {
        self.sign_out_with(caller, None).await
    }

    /// Ends the session of the caller's token and, with `also` (the web
    /// app's cookie beside a bearer token), that token's session too: one
    /// read and one write. The caller's token decides the answer (not a
    /// live session: `Unauthenticated`), but `also`'s session ends
    /// whatever it is; an `also` that is no live session has nothing to end.
    pub async fn sign_out_with(&self, caller: &Caller, also: Option<&str>) -> Result<()> {
        let Caller::Token(token) = caller else {
            return Err(EngineError::Unauthenticated("sign in first".into()));
        };
        // (username if well formed, hash) of each token, the caller's first.
        let tokens: Vec<(Option<&str>, [u8; 32])> = std::iter::once(token.as_str())
            .chain(also.filter(|a| *a != token))
            .map(|t| (token_user(t), session_hash(t)))
            .collect();
        let keys: Vec<Key> = tokens
            .iter()
            .map(|(_, hash)| schema::session_key(hash))
            .collect();
        self.retrying(|| async {
            let rows = {
                let mut snap = self.snapshot().await?;
                snap.read(&keys, &[]).await?.rows
            };
            let mut b = Batch::new();
            let mut mine = false;
            for (i, ((username, hash), row)) in tokens.iter().zip(&rows).enumerate() {
                let live = match (username, row) {
                    (Some(u), Some(row)) => {
                        schema::decode::<SessionRow>("session", row)?.username == *u
                    }
                    _ => false,
                };
                if live {
                    let u = username.expect("live sessions have a user");
                    b.delete(keys[i].clone())
                        .delete(schema::user_session_key(u, hash));
                }
                mine |= i == 0 && live;
            }
            if !b.is_empty() {
                self.store().write(b).await?;
            }
            if mine {
                Ok(())
            } else {
                Err(invalid_session())
            }
        })
        .await
    }

    /// The caller's user and every group they belong to.
    pub async fn me(&self, caller: &Caller) -> Result<Me> {
        self.retrying(|| async {
            let mut snap = self.snapshot().await?;
            let (actor, _) = self.resolve(&mut snap, caller, &[], &[]).await?;
            actor.require_user()?;
            let groups = actor.groups().map(str::to_string).collect();
            let (user, _) = actor
                .user
                .ok_or_else(|| EngineError::Unauthenticated("the user no longer exists".into()))?;
            Ok(Me { user, groups })
        })
        .await
    }

    /// A user's public face (any caller may look).
    pub async fn get_user(&self, caller: &Caller, username: &str) -> Result<User> {
        // A name no user can have is read as no one's.
        let keys: Vec<Key> = crate::is_valid_name(username)
            .then(|| schema::user_key(username))
            .into_iter()
            .collect();
        let row = self
            .retrying(|| async {
                let mut snap = self.snapshot().await?;
                // A token presented is checked, as everywhere.
                let mut own = self.resolve(&mut snap, caller, &keys, &[]).await?.1;
                Ok(own.rows.pop().flatten())
            })
            .await?;
        row.map(|row| schema::decode("user", &row))
            .transpose()?
            .ok_or_else(|| EngineError::NotFound(format!("no user {username}")))
    }

    /// Changes a user's properties by an RFC 7396 merge patch: the user
    /// themselves or an administrator. Who asks is checked before whom:
    /// another user's properties are forbidden, whether or not that user
    /// exists (usernames are public anyway).
    pub async fn patch_user(
        &self,
        caller: &Caller,
        username: &str,
        patch: &Map<String, Value>,
    ) -> Result<User> {
        let keys: Vec<Key> = crate::is_valid_name(username)
            .then(|| schema::user_key(username))
            .into_iter()
            .collect();
        self.retrying(|| async {
            let mut snap = self.snapshot().await?;
            let (actor, own) = self.resolve(&mut snap, caller, &keys, &[]).await?;
            drop(snap);
            if actor.require_user()? != username && !actor.admin {
                return Err(EngineError::Forbidden(
                    "only the user themselves or an administrator changes a user's properties"
                        .into(),
                ));
            }
            let row = own
                .rows
                .into_iter()
                .next()
                .flatten()
                .ok_or_else(|| EngineError::NotFound(format!("no user {username}")))?;
            let mut user: User = schema::decode("user", &row)?;
            let properties = crate::model::merged(&user.properties, patch);
            self.check_properties(&properties)?;
            if properties == user.properties {
                // Nothing to write: the row (which sign-ins and password
                // changes guard on) keeps its version.
                return Ok(user);
            }
            user.properties = properties;
            let key = schema::user_key(username);
            let mut b = Batch::new();
            b.put(key.clone(), schema::encode(&user), row.version + 1)
                .guard(key, Expect::Version(row.version));
            self.store().write(b).await?;
            Ok(user)
        })
        .await
    }

    pub(crate) fn check_properties(&self, p: &Map<String, Value>) -> Result<()> {
        check_properties_depth(p)?;
        self.check_properties_size(serde_json::to_vec(p).map_or(usize::MAX, |v| v.len()))
    }

    /// Refuses properties of `size` bytes, serialised, over the limit.
    pub(crate) fn check_properties_size(&self, size: usize) -> Result<()> {
        if size > self.inner.config.max_properties {
            return Err(EngineError::TooLarge(format!(
                "properties take {size} bytes, more than {}",
                self.inner.config.max_properties
            )));
        }
        Ok(())
    }
}

/// Refuses properties nested deeper than [`MAX_PROPERTIES_DEPTH`]. The
/// limit is kept where properties are written: every record that carries
/// them (an item row, a change entry with the item in it) nests them a few
/// levels further, and each must read back under the JSON reader's own
/// limit of 128 levels, or one item would break the feed for everyone.
pub(crate) fn check_properties_depth(p: &Map<String, Value>) -> Result<()> {
    fn depth(v: &Value) -> usize {
        match v {
            Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
            Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }
    let d = 1 + p.values().map(depth).max().unwrap_or(0);
    if d > MAX_PROPERTIES_DEPTH {
        return Err(EngineError::InvalidInput(format!(
            "properties nest {d} levels deep, more than {MAX_PROPERTIES_DEPTH}"
        )));
    }
    Ok(())
}

/// Most levels of objects and arrays in properties, the properties object
/// itself included.
pub const MAX_PROPERTIES_DEPTH: usize = 64;

/// Runs `f` when dropped.
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

/// Refuses a user whose stored password hash is no Argon2id hash (from an
/// import: the API stores nothing else).
pub(crate) fn check_stored_hash(user: &User) -> Result<()> {
    match argon2::password_hash::phc::PasswordHash::new(&user.password_hash) {
        Ok(h) if h.algorithm.as_str() == "argon2id" => Ok(()),
        _ => Err(EngineError::InvalidInput(format!(
            "user {}: the password hash is no Argon2id hash",
            user.username
        ))),
    }
}

fn taken_name(username: &str) -> EngineError {
    EngineError::Conflict(format!("the username {username} is taken"))
}

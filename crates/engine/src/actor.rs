//! Who an operation acts for: the caller's session, user, and every group
//! they belong to, resolved in the operation's own snapshot.
//!
//! A session token is `<username>.<secret>`, so the first read of an
//! operation can fetch the session row, the user row and the user's direct
//! memberships together, beside whatever else the operation reads first;
//! each further level of group nesting is one more read. Resolution never
//! fails for being in many groups: memberships are bounded where they are
//! written ([`MAX_GROUPS`], [`MAX_DEPTH`]); if nesting made a caller's
//! groups exceed the bound anyway, the walk stops at the bound (the groups
//! nearest the caller first) instead of locking the caller out.

use std::collections::HashSet;
use std::ops::Bound;

use tarn_store::{Key, ReadResult, Row, Scan, Snapshot};

use crate::error::{EngineError, Result};
use crate::schema::{self, SessionRow, MEMBERSHIPS};
use crate::{sha256, Caller, Engine, Principal, User};

/// Deepest nesting followed when computing a caller's groups.
pub(crate) const MAX_DEPTH: usize = 32;
/// Most groups one principal may belong to, nesting included: enforced when
/// memberships are written, and where reading stops.
pub(crate) const MAX_GROUPS: usize = 1000;

/// The resolved caller of one operation.
#[derive(Clone, Debug)]
pub(crate) struct Actor {
    /// The username, if signed in.
    pub username: Option<String>,
    /// Whether the caller is an administrator.
    pub admin: bool,
    /// Their user, `authenticated`, `everyone`, then every group they
    /// belong to, nearest first.
    pub principals: Vec<Principal>,
    /// Groups of `principals` the caller joined after the change feed's
    /// start, each with the feed's end when it joined (read in the
    /// joining write's snapshot): a change at or before that cursor was
    /// not the caller's to see through that group.
    pub joined: Vec<(Principal, Vec<u8>)>,
    /// The user row and its revision, when signed in and the user exists.
    pub user: Option<(User, u64)>,
}

impl Actor {
    pub(crate) fn require_user(&self) -> Result<&str> {
        self.username
            .as_deref()
            .ok_or_else(|| EngineError::Unauthenticated("sign in first".into()))
    }

    pub(crate) fn require_admin(&self) -> Result<()> {
        self.require_user()?;
        if self.admin {
            Ok(())
        } else {
            Err(EngineError::Forbidden("administrators only".into()))
        }
    }

    /// Whether a change at feed cursor `at` that names `p` was the
    /// caller's to see through `p`: the caller holds `p` and, if it joined
    /// `p` since the feed began, joined it before the change.
    pub(crate) fn saw_through(&self, p: &Principal, at: &[u8]) -> bool {
        self.principals.contains(p)
            && self
                .joined
                .iter()
                .all(|(g, since)| g != p || at > since.as_slice())
    }

    /// Every group the caller belongs to.
    pub(crate) fn groups(&self) -> impl Iterator<Item = &str> {
        self.principals.iter().filter_map(|p| match p {
            Principal::Group(g) => Some(g.as_str()),
            _ => None,
        })
    }
}

/// The value of a membership row: the change feed's end when it was
/// written, after a `@` (rows written before it kept one are a mark).
pub(crate) fn membership_value(feed_end: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(feed_end.len() + 1);
    v.push(b'@');
    v.extend_from_slice(feed_end);
    v
}

/// The feed cursor a membership row holds, if it holds one.
pub(crate) fn join_cursor(value: &[u8]) -> Option<Vec<u8>> {
    value.strip_prefix(b"@").map(<[u8]>::to_vec)
}

/// A group's nesting into another that is written but not yet checked
/// (see [`groups`](crate::groups)): it makes no one a member. Nestings
/// are ordered by the writer's clock, then a nonce, so that every node
/// orders two of them alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Pending {
    /// Microseconds since the epoch, on the writer's clock.
    pub stamp: u64,
    pub nonce: u64,
}

impl Pending {
    /// The value of both rows of a pending nesting.
    pub(crate) fn value(self) -> Vec<u8> {
        let mut v = Vec::with_capacity(17);
        v.push(b'?');
        v.extend_from_slice(&self.stamp.to_be_bytes());
        v.extend_from_slice(&self.nonce.to_be_bytes());
        v
    }

    /// The pending nesting a member or membership row holds, if it is one.
    pub(crate) fn of(value: &[u8]) -> Option<Pending> {
        let rest = value.strip_prefix(b"?")?;
        Some(Pending {
            stamp: u64::from_be_bytes(rest.get(..8)?.try_into().ok()?),
            nonce: u64::from_be_bytes(rest.get(8..16)?.try_into().ok()?),
        })
    }
}

/// Which pending nestings a walk follows: none (who belongs where), or,
/// to check a nesting change, every other one or the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    Settled,
    AllBut(Pending),
    Before(Pending),
}

impl Admit {
    /// Whether a row of `value` counts.
    pub(crate) fn admits(self, value: &[u8]) -> bool {
        match (Pending::of(value), self) {
            (None, _) => true,
            (Some(_), Admit::Settled) => false,
            (Some(p), Admit::AllBut(mine)) => p != mine,
            (Some(p), Admit::Before(mine)) => p < mine,
        }
    }
}

/// A pending nesting a walk saw: the member, the group, the nesting and
/// its rows' version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    pub member: String,
    pub group: String,
    pub pending: Pending,
    pub version: u64,
}

/// The hash a session is stored under.
pub(crate) fn session_hash(token: &str) -> [u8; 32] {
    sha256(token.as_bytes())
}

/// The username a token names (`<username>.<secret>`), if it is well formed.
pub(crate) fn token_user(token: &str) -> Option<&str> {
    let (user, secret) = token.rsplit_once('.')?;
    (crate::is_valid_name(user) && secret.len() >= 32).then_some(user)
}

/// A principal whose memberships a [`Walk`] is still to read.
#[derive(Debug)]
struct Step {
    principal: String,
    /// Where a paged read of its memberships stopped.
    after: Option<Vec<u8>>,
    /// The latest join cursor on the path to it.
    path: Option<Vec<u8>>,
}

/// An upward walk of memberships: one level per read, nearest groups first,
/// bounded in depth and size.
#[derive(Debug)]
pub(crate) struct Walk {
    /// Groups found, in the order found.
    pub found: Vec<String>,
    /// For each of `found`, the feed's end when the walk's start came to
    /// belong to it along the path found (the latest join on the path),
    /// if any join on it recorded one.
    pub joined: Vec<Option<Vec<u8>>>,
    seen: HashSet<String>,
    /// Principals whose memberships are still to read.
    frontier: Vec<Step>,
    depth: usize,
    /// A direct membership of the start left out of the walk (its group is
    /// still found if reached through another).
    except: Option<(String, String)>,
    /// The pending nestings followed.
    admit: Admit,
    /// Every pending nesting read, followed or not.
    pub pending: Vec<Seen>,
    /// Whether the bound stopped the walk early.
    pub truncated: bool,
}

impl Walk {
    /// A walk from one principal.
    pub(crate) fn from(start: &Principal) -> Walk {
        Walk {
            found: Vec::new(),
            joined: Vec::new(),
            seen: HashSet::new(),
            frontier: vec![Step {
                principal: start.to_string(),
                after: None,
                path: None,
            }],
            depth: 0,
            except: None,
            admit: Admit::Settled,
            pending: Vec::new(),
            truncated: false,
        }
    }

    /// A walk from one principal that follows the pending nestings `admit`
    /// lets through.
    pub(crate) fn admitting(start: &Principal, admit: Admit) -> Walk {
        Walk {
            admit,
            ..Walk::from(start)
        }
    }

    /// A walk from one principal as if it were not a direct member of
    /// `group`: the groups it would still belong to after leaving it.
    pub(crate) fn without(start: &Principal, group: &str) -> Walk {
        Walk {
            except: Some((start.to_string(), group.to_string())),
            ..Walk::from(start)
        }
    }

    pub(crate) fn done(&self) -> bool {
        self.frontier.is_empty()
    }

    fn per_scan(&self) -> usize {
        let fair = tarn_store::MAX_READ_ROWS / self.frontier.len().max(1);
        fair.clamp(16, MAX_GROUPS + 1)
    }

    /// The scans of the next level.
    pub(crate) fn scans(&self) -> Vec<Scan> {
        let per = self.per_scan();
        self.frontier
            .iter()
            .map(|step| {
                let lower = step.after.clone().map_or(Bound::Unbounded, Bound::Excluded);
                Scan::partition(MEMBERSHIPS, step.principal.as_bytes().to_vec(), per)
                    .bounds(lower, Bound::Excluded(schema::GATE.to_vec()))
            })
            .collect()
    }

    /// Takes the answers of [`Walk::scans`], in order.
    pub(crate) fn absorb(&mut self, answers: &[Vec<Row>]) -> Result<()> {
        let per = self.per_scan();
        // The read after the deepest level only tells whether groups lie
        // beyond the bound: one found there truncates the walk.
        let beyond = self.depth >= MAX_DEPTH;
        let frontier = std::mem::take(&mut self.frontier);
        let mut next = Vec::new();
        for (
            Step {
                principal, path, ..
            },
            rows,
        ) in frontier.into_iter().zip(answers)
        {
            for row in rows {
                let g = std::str::from_utf8(&row.clustering)
                    .map_err(|e| crate::error::corrupt("membership", e))?;
                if let Some(pending) = Pending::of(&row.value) {
                    self.pending.push(Seen {
                        member: principal.clone(),
                        group: g.to_string(),
                        pending,
                        version: row.version,
                    });
                }
                if !self.admit.admits(&row.value) {
                    continue;
                }
                if self
                    .except
                    .as_ref()
                    .is_some_and(|(p, e)| *p == principal && e == g)
                {
                    continue;
                }
                if self.seen.contains(g) {
                    if beyond {
                        continue;
                    }
                    // Reached another way: the caller belongs to it since
                    // the earlier of the two ways.
                    // The groups above it are read again with that way's
                    // cursor, so they take it too.
                    let other = path.clone().max(join_cursor(&row.value));
                    if let Some(i) = self.found.iter().position(|f| f == g) {
                        if other < self.joined[i] {
                            self.joined[i] = other.clone();
                            next.push(Step {
                                principal: format!("group:{g}"),
                                after: None,
                                path: other,
                            });
                        }
                    }
                    continue;
                }
                if beyond || self.found.len() >= MAX_GROUPS {
                    self.truncated = true;
                    break;
                }
                let joined = path.clone().max(join_cursor(&row.value));
                self.seen.insert(g.to_string());
                self.found.push(g.to_string());
                self.joined.push(joined.clone());
                next.push(Step {
                    principal: format!("group:{g}"),
                    after: None,
                    path: joined,
                });
            }
            if rows.len() >= per && !self.truncated {
                // More memberships than one read takes: page on.
                let last = rows.last().map(|r| r.clustering.clone());
                next.push(Step {
                    principal,
                    after: last,
                    path,
                });
            }
        }
        self.depth += 1;
        if self.truncated || self.depth > MAX_DEPTH {
            self.truncated |= !next.is_empty();
            next.clear();
        }
        self.frontier = next;
        Ok(())
    }
}

/// A caller being resolved: what the first read needs, then the walk.
pub(crate) struct Resolve {
    kind: Who,
    walk: Option<Walk>,
}

enum Who {
    Anonymous,
    Token {
        hash: [u8; 32],
        username: String,
    },
    Trusted {
        username: String,
        admin: bool,
    },
    Resolved {
        username: String,
        admin: bool,
        user: Option<(User, u64)>,
    },
}

impl Resolve {
    /// Starts resolving; a malformed token is refused here.
    pub(crate) fn new(caller: &Caller) -> Result<Resolve> {
        let kind = match caller {
            Caller::Anonymous => Who::Anonymous,
            Caller::Token(t) => {
                let username = token_user(t).ok_or_else(invalid_session)?.to_string();
                Who::Token {
                    hash: session_hash(t),
                    username,
                }
            }
            Caller::User { username, admin } => Who::Trusted {
                username: username.clone(),
                admin: *admin,
            },
        };
        let walk = match &kind {
            Who::Token { username, .. } | Who::Trusted { username, .. } => {
                Some(Walk::from(&Principal::User(username.clone())))
            }
            _ => None,
        };
        Ok(Resolve { kind, walk })
    }

    /// Keys of the first read: the session and the user.
    pub(crate) fn first_gets(&self) -> Vec<Key> {
        match &self.kind {
            Who::Token { hash, username } => {
                vec![schema::session_key(hash), schema::user_key(username)]
            }
            Who::Trusted { username, .. } => vec![schema::user_key(username)],
            _ => Vec::new(),
        }
    }

    /// Scans of the next read: the next level of memberships.
    pub(crate) fn scans(&self) -> Vec<Scan> {
        self.walk.as_ref().map_or_else(Vec::new, Walk::scans)
    }

    /// Whether the walk is over.
    pub(crate) fn done(&self) -> bool {
        self.walk.as_ref().is_none_or(Walk::done)
    }

    /// Takes the answers to [`Resolve::first_gets`] and checks the session.
    pub(crate) fn absorb_first(&mut self, engine: &Engine, rows: &[Option<Row>]) -> Result<()> {
        let kind = std::mem::replace(&mut self.kind, Who::Anonymous);
        self.kind = match kind {
            Who::Token { hash, username } => {
                let session = rows[0].as_ref().ok_or_else(invalid_session)?;
                let session: SessionRow = schema::decode("session", session)?;
                if session.username != username {
                    return Err(invalid_session());
                }
                if session.expires_at <= engine.now() {
                    engine.forget_session(hash, username);
                    return Err(invalid_session());
                }
                let user = rows[1].as_ref().ok_or_else(invalid_session)?;
                let user: User = schema::decode("user", user)?;
                let version = rows[1].as_ref().map_or(0, |r| r.version);
                Who::Resolved {
                    username,
                    admin: user.admin,
                    user: Some((user, version)),
                }
            }
            Who::Trusted { username, admin } => {
                let user = match &rows[0] {
                    Some(r) => Some((schema::decode::<User>("user", r)?, r.version)),
                    None => None,
                };
                Who::Resolved {
                    username,
                    admin,
                    user,
                }
            }
            other => other,
        };
        Ok(())
    }

    /// Takes the answers to [`Resolve::scans`].
    pub(crate) fn absorb_scans(&mut self, answers: &[Vec<Row>]) -> Result<()> {
        match &mut self.walk {
            Some(w) => w.absorb(answers),
            None => Ok(()),
        }
    }

    /// The principals known so far (complete once [`Resolve::done`]).
    pub(crate) fn principals(&self) -> Vec<Principal> {
        let mut out = match &self.kind {
            Who::Anonymous => return vec![Principal::Everyone],
            Who::Token { username, .. }
            | Who::Trusted { username, .. }
            | Who::Resolved { username, .. } => vec![
                Principal::User(username.clone()),
                Principal::Authenticated,
                Principal::Everyone,
            ],
        };
        if let Some(w) = &self.walk {
            out.extend(w.found.iter().cloned().map(Principal::Group));
        }
        out
    }

    /// The resolved actor.
    pub(crate) fn finish(self) -> Actor {
        let principals = self.principals();
        let joined = self.walk.as_ref().map_or_else(Vec::new, |w| {
            w.found
                .iter()
                .zip(&w.joined)
                .filter_map(|(g, j)| Some((Principal::Group(g.clone()), j.clone()?)))
                .collect()
        });
        if let Some(w) = &self.walk {
            if w.truncated {
                tracing::warn!(
                    principal = %principals[0],
                    groups = w.found.len(),
                    "memberships beyond the bound are not counted"
                );
            }
        }
        match self.kind {
            Who::Resolved {
                username,
                admin,
                user,
            } => Actor {
                username: Some(username),
                admin,
                principals,
                joined,
                user,
            },
            _ => Actor {
                username: None,
                admin: false,
                principals,
                joined,
                user: None,
            },
        }
    }
}

pub(crate) fn invalid_session() -> EngineError {
    EngineError::Unauthenticated("the session is not valid".into())
}

impl Engine {
    /// Resolves the caller in `snap`, with `gets` and `scans` of the
    /// operation's own riding along in the first read. Answers the actor and
    /// the answers to the operation's own reads.
    pub(crate) async fn resolve(
        &self,
        snap: &mut Box<dyn Snapshot>,
        caller: &Caller,
        gets: &[Key],
        scans: &[Scan],
    ) -> Result<(Actor, ReadResult)> {
        let mut res = Resolve::new(caller)?;
        let mut all_gets = res.first_gets();
        let first = all_gets.len();
        all_gets.extend_from_slice(gets);
        let mut all_scans = res.scans();
        let walk = all_scans.len();
        all_scans.extend_from_slice(scans);
        let mut out = crate::read(snap, &all_gets, &all_scans).await?;
        res.absorb_first(self, &out.rows[..first])?;
        res.absorb_scans(&out.scans[..walk])?;
        let own = ReadResult {
            rows: out.rows.split_off(first),
            scans: out.scans.split_off(walk),
        };
        let actor = self.walk_to_end(snap, res).await?;
        Ok((actor, own))
    }

    /// Whether the caller's session still holds (not signed out, not
    /// expired, its user not gone): one read of the session and user rows.
    /// Callers that are not a session always hold.
    pub(crate) async fn session_holds(&self, caller: &Caller) -> Result<()> {
        let mut res = Resolve::new(caller)?;
        if !matches!(res.kind, Who::Token { .. }) {
            return Ok(());
        }
        let gets = res.first_gets();
        self.retrying(|| async {
            let mut snap = self.snapshot().await?;
            Ok(crate::read(&mut snap, &gets, &[]).await?.rows)
        })
        .await
        .and_then(|rows| res.absorb_first(self, &rows))
    }

    /// Reads the remaining levels of a caller's memberships.
    pub(crate) async fn walk_to_end(
        &self,
        snap: &mut Box<dyn Snapshot>,
        mut res: Resolve,
    ) -> Result<Actor> {
        while !res.done() {
            let scans = res.scans();
            let out = crate::read(snap, &[], &scans).await?;
            res.absorb_scans(&out.scans)?;
        }
        Ok(res.finish())
    }

    /// Every group `start` belongs to, directly or through nesting, nearest
    /// first, and whether the bound stopped the walk.
    pub(crate) async fn groups_of(
        &self,
        snap: &mut Box<dyn Snapshot>,
        start: &Principal,
    ) -> Result<Walk> {
        self.finish_walk(snap, Walk::from(start)).await
    }

    /// Reads the levels of every walk of `walks` to its end, together: one
    /// read a level for all of them.
    pub(crate) async fn finish_walks(
        &self,
        snap: &mut Box<dyn Snapshot>,
        mut walks: Vec<Walk>,
    ) -> Result<Vec<Walk>> {
        loop {
            let open: Vec<(usize, Vec<Scan>)> = walks
                .iter()
                .enumerate()
                .filter(|(_, w)| !w.done())
                .map(|(i, w)| (i, w.scans()))
                .collect();
            if open.is_empty() {
                return Ok(walks);
            }
            let all: Vec<Scan> = open.iter().flat_map(|(_, s)| s.iter().cloned()).collect();
            let mut answers = crate::read(snap, &[], &all).await?.scans.into_iter();
            for (i, scans) in &open {
                let mine: Vec<Vec<Row>> = answers.by_ref().take(scans.len()).collect();
                walks[*i].absorb(&mine)?;
            }
        }
    }

    /// Reads the levels of `walk` to its end.
    pub(crate) async fn finish_walk(
        &self,
        snap: &mut Box<dyn Snapshot>,
        mut walk: Walk,
    ) -> Result<Walk> {
        while !walk.done() {
            let out = crate::read(snap, &[], &walk.scans()).await?;
            walk.absorb(&out.scans)?;
        }
        Ok(walk)
    }

    /// The caller's effective principals: their user, `authenticated`,
    /// `everyone`, and every group they belong to directly or through
    /// nesting, read in one snapshot.
    pub async fn principals(&self, caller: &Caller) -> Result<Vec<Principal>> {
        self.retrying(|| async {
            let mut snap = self.snapshot().await?;
            let (actor, _) = self.resolve(&mut snap, caller, &[], &[]).await?;
            Ok(actor.principals)
        })
        .await
    }

    /// Removes an expired session's rows (the first request that presents
    /// it finds it expired), beside the request, which fails anyway.
    fn forget_session(&self, hash: [u8; 32], username: String) {
        let store = self.store().clone();
        tokio::spawn(async move {
            let mut b = tarn_store::Batch::new();
            b.delete(schema::session_key(&hash))
                .delete(schema::user_session_key(&username, &hash));
            if let Err(e) = store.write(b).await {
                tracing::warn!(error = %e, "an expired session's rows stay until next time");
            }
        });
    }
}

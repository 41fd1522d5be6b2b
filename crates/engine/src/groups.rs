//! Groups: members, managers and nesting.
//!
//! Limits are enforced where memberships are written, never where they are
//! read: a membership that would put a user in more than
//! [`MAX_GROUPS`](crate::actor::MAX_GROUPS) groups, or nest groups deeper
//! than [`MAX_DEPTH`](crate::actor::MAX_DEPTH) levels, is refused; leaving a
//! group is always allowed; and a user creates at most
//! [`EngineConfig::groups_per_hour`](crate::EngineConfig) groups an hour. So
//! adding someone to groups never makes their reads fail nor takes groups
//! they had from them; it can fill their room for groups, so that further
//! memberships that reach them are refused (`409`), until they leave some.

use std::collections::{BTreeSet, HashSet};
use std::ops::Bound;
use std::time::Duration;

use serde_json::{Map, Value};

use tarn_store::{Batch, Expect, Key, Scan, Snapshot, SnapshotExt, StoreError};

use crate::actor::{membership_value, Actor, Admit, Pending, Seen, Walk, MAX_DEPTH, MAX_GROUPS};
use crate::changes::{Delta, CHANGES};
use crate::error::{EngineError, Result};
use crate::model::check_new_name;
use crate::schema::{self, MEMBERS, MEMBERSHIPS, THROTTLE};
use crate::{seal, unseal, Caller, Engine, Group, Principal};

/// Most groups nested below one group that a nesting change examines.
const MAX_NESTED_BELOW: usize = 1000;
/// Most users in a group and the groups below it that a nesting of it
/// examines, each against [`MAX_GROUPS`]; past it the nesting is refused.
const MAX_USERS_BELOW: usize = 10_000;
/// Most times a nesting change looks again at later pending nestings it
/// conflicts with before it gives up (about 7 s).
const NESTING_WAITS: u32 = 40;

/// A pause before looking again at pending nestings: 4, 8, ... ms, at
/// most 128, and as much again of jitter.
async fn nesting_pause(wait: u32) {
    let base = 2u64 << wait.min(6);
    let jitter = crate::random_u64() % base;
    tokio::time::sleep(Duration::from_millis(base + jitter)).await;
}
/// Most managers of one group.
pub(crate) const MAX_MANAGERS: usize = 256;

/// One page of a group's members.
#[derive(Clone, Debug)]
pub struct MemberPage {
    /// Members in principal order.
    pub members: Vec<Principal>,
    /// Cursor of the next page, if any.
    pub next: Option<String>,
}

fn decode_group(row: &Option<tarn_store::Row>) -> Result<Option<(Group, u64)>> {
    match row {
        Some(r) => Ok(Some((schema::decode("group", r)?, r.version))),
        None => Ok(None),
    }
}

fn no_group(id: &str) -> EngineError {
    EngineError::NotFound(format!("no group {id}"))
}

fn member_key(group: &str, member: &str) -> Key {
    Key::new(MEMBERS, group.as_bytes(), member.as_bytes())
}

fn membership_key(member: &str, group: &str) -> Key {
    Key::new(MEMBERSHIPS, member.as_bytes(), group.as_bytes())
}

fn manages(actor: &Actor, group: &Group) -> bool {
    actor.admin || group.managers.iter().any(|m| actor.principals.contains(m))
}

impl Engine {
    /// The caller and a group, read together; the group must exist.
    async fn actor_and_group(
        &self,
        snap: &mut Box<dyn Snapshot>,
        caller: &Caller,
        id: &str,
    ) -> Result<(Actor, Group, u64)> {
        if !crate::is_valid_name(id) {
            return Err(no_group(id));
        }
        let (actor, own) = self
            .resolve(snap, caller, &[schema::group_key(id)], &[])
            .await?;
        actor.require_user()?;
        let (group, version) = decode_group(&own.rows[0])?.ok_or_else(|| no_group(id))?;
        Ok((actor, group, version))
    }

    /// Creates a group; its creator becomes its manager.
    pub async fn create_group(
        &self,
        caller: &Caller,
        id: &str,
        title: Option<String>,
        properties: Map<String, Value>,
    ) -> Result<Group> {
        check_new_name("group id", id)?;
        self.check_properties(&properties)?;
        let title = title.unwrap_or_default();
        check_title(&title)?;
        let actor = self
            .retrying(|| async {
                let mut snap = self.snapshot().await?;
                Ok(self.resolve(&mut snap, caller, &[], &[]).await?.0)
            })
            .await?;
        let username = actor.require_user()?.to_string();
        if !actor.admin {
            self.count_group_creation(&username, id).await?;
        }
        let group = Group {
            id: id.to_string(),
            title,
            properties,
            managers: vec![Principal::User(username.clone())],
            created_at: self.now(),
            created_by: username,
        };
        let key = schema::group_key(id);
        let mut b = Batch::new();
        b.put(key.clone(), schema::encode(&group), 1)
            .guard(key, Expect::Absent);
        self.create_row(b, || {
            EngineError::Conflict(format!("the group {id} exists"))
        })
        .await?;
        Ok(group)
    }

    /// Counts one group creation in the user's hourly window; refuses past
    /// the limit, and refuses (without counting) an id already taken.
    async fn count_group_creation(&self, username: &str, id: &str) -> Result<()> {
        const HOUR: i64 = 3600 * 1_000_000;
        let limit = self.config().groups_per_hour;
        let key = Key::new(
            THROTTLE,
            format!("groups:{username}").into_bytes(),
            b"w".to_vec(),
        );
        self.retrying(|| async {
            let now = self.now();
            let mut snap = self.snapshot().await?;
            let read = crate::read(&mut snap, &[schema::group_key(id), key.clone()], &[]).await?;
            if read.rows[0].is_some() {
                return Err(EngineError::Conflict(format!("the group {id} exists")));
            }
            let (start, count, expect, version) = match &read.rows[1] {
                Some(r) => {
                    let (start, count): (i64, u32) = schema::decode("group window", r)?;
                    (start, count, Expect::Version(r.version), r.version + 1)
                }
                None => (now, 0, Expect::Absent, 1),
            };
            let (start, count) = if now - start >= HOUR {
                (now, 0)
            } else {
                (start, count)
            };
            if count >= limit {
                let secs = ((start + HOUR - now) / 1_000_000 + 1).max(1) as u64;
                return Err(EngineError::RateLimited {
                    detail: format!("at most {limit} new groups an hour; try again in {secs} s"),
                    retry_after: secs,
                });
            }
            let mut b = Batch::new();
            b.put(key.clone(), schema::encode(&(start, count + 1)), version)
                .guard(key.clone(), expect);
            self.store().write(b).await?;
            Ok(())
        })
        .await
    }

    /// A group (signed-in callers).
    pub async fn get_group(&self, caller: &Caller, id: &str) -> Result<Group> {
        self.retrying(|| async {
            let mut snap = self.snapshot().await?;
            let (_, group, _) = self.actor_and_group(&mut snap, caller, id).await?;
            Ok(group)
        })
        .await
    }

    /// How many levels of groups lie below `group` (0: no nested group),
    /// with those groups, or a refusal when there are too many to examine;
    /// the pending nestings read go to `seen`.
    async fn depth_below(
        &self,
        snap: &mut Box<dyn Snapshot>,
        group: &str,
        admit: Admit,
        seen_pending: &mut Vec<Seen>,
    ) -> Result<(usize, BTreeSet<String>)> {
        let mut level = vec![group.to_string()];
        let mut seen = BTreeSet::new();
        let mut depth = 0;
        while !level.is_empty() {
            if depth > MAX_DEPTH {
                break;
            }
            // Members are ordered by principal: `group:` sorts before
            // `user:`, so the nested groups come first and alone.
            let scans: Vec<Scan> = level
                .iter()
                .map(|g| {
                    Scan::partition(MEMBERS, g.as_bytes().to_vec(), 64).bounds(
                        Bound::Included(b"group:".to_vec()),
                        Bound::Excluded(b"group;".to_vec()),
                    )
                })
                .collect();
            let mut next = Vec::new();
            for (chunk, of) in scans
                .chunks(tarn_store::MAX_READ_ROWS / 64)
                .zip(level.chunks(tarn_store::MAX_READ_ROWS / 64))
            {
                for (rows, parent) in snap.scan_many(chunk).await?.into_iter().zip(of) {
                    if rows.len() >= 64 {
                        return Err(too_many_below(group));
                    }
                    for r in rows {
                        let p = std::str::from_utf8(&r.clustering)
                            .map_err(|e| crate::error::corrupt("member", e))?;
                        if let Some(pending) = Pending::of(&r.value) {
                            seen_pending.push(Seen {
                                member: p.to_string(),
                                group: parent.clone(),
                                pending,
                                version: r.version,
                            });
                        }
                        if !admit.admits(&r.value) {
                            continue;
                        }
                        if let Some(g) = p.strip_prefix("group:") {
                            if seen.insert(g.to_string()) {
                                next.push(g.to_string());
                            }
                        }
                    }
                }
            }
            if seen.len() > MAX_NESTED_BELOW {
                return Err(too_many_below(group));
            }
            if !next.is_empty() {
                depth += 1;
            }
            level = next;
        }
        Ok((depth, seen))
    }

    /// Why nesting `child` into a group is refused for a user of `child`
    /// or of the groups below it, if it is: each comes to belong to the
    /// groups `gained` too, and none may pass [`MAX_GROUPS`] (else
    /// resolving their groups would stop at the bound, and they would lose
    /// groups they had without a word). Each user is examined once, a page
    /// at a time with the page's walks read together, and at most
    /// [`MAX_USERS_BELOW`] of them: past that the nesting is refused, so
    /// that no request does work without bound. The pending nestings the
    /// walks read go to `seen`.
    async fn users_past_the_bound(
        &self,
        snap: &mut Box<dyn Snapshot>,
        child: &str,
        gained: &BTreeSet<String>,
        admit: Admit,
        seen: &mut Vec<Seen>,
    ) -> Result<Option<String>> {
        const PAGE: usize = 64;
        let (_, below) = self.depth_below(snap, child, admit, seen).await?;
        let mut examined = HashSet::new();
        for group in std::iter::once(child).chain(below.iter().map(String::as_str)) {
            let mut after = Bound::Included(b"user:".to_vec());
            loop {
                let scan = Scan::partition(MEMBERS, group.as_bytes().to_vec(), PAGE)
                    .bounds(after, Bound::Excluded(b"user;".to_vec()));
                let rows = snap.scan_many(&[scan]).await?.remove(0);
                let mut users = Vec::new();
                for r in &rows {
                    let name = std::str::from_utf8(&r.clustering)
                        .ok()
                        .and_then(|p| p.strip_prefix("user:"))
                        .ok_or_else(|| crate::error::corrupt("member", "not a user"))?;
                    if examined.insert(name.to_string()) {
                        users.push(Principal::User(name.to_string()));
                    }
                }
                if examined.len() > MAX_USERS_BELOW {
                    return Ok(Some(format!(
                        "more than {MAX_USERS_BELOW} users are in group:{child} and the groups below it: too many to nest it further"
                    )));
                }
                let walks = users.iter().map(|u| Walk::admitting(u, admit)).collect();
                for (user, walk) in users.iter().zip(self.finish_walks(snap, walks).await?) {
                    seen.extend(walk.pending.iter().cloned());
                    let mut would_have: BTreeSet<&str> =
                        walk.found.iter().map(String::as_str).collect();
                    would_have.extend(gained.iter().map(String::as_str));
                    if walk.truncated || would_have.len() > MAX_GROUPS {
                        return Ok(Some(format!(
                            "{user}, a member of group:{child}, would belong to more than {MAX_GROUPS} groups"
                        )));
                    }
                }
                match rows.last() {
                    Some(last) if rows.len() == PAGE => {
                        after = Bound::Excluded(last.clustering.clone());
                    }
                    _ => break,
                }
            }
        }
        Ok(None)
    }

    /// Why nesting `child` into `id` is refused, counting the pending
    /// nestings `admit` lets through (`None`: it is not), with every
    /// pending nesting read on the way.
    async fn nesting_refusal(
        &self,
        snap: &mut Box<dyn Snapshot>,
        id: &str,
        child: &str,
        admit: Admit,
    ) -> Result<(Option<EngineError>, Vec<Seen>)> {
        let group = |g: &str| Principal::Group(g.to_string());
        let above = self
            .finish_walk(snap, Walk::admitting(&group(id), admit))
            .await?;
        let mine = self
            .finish_walk(snap, Walk::admitting(&group(child), admit))
            .await?;
        let mut seen = [above.pending.clone(), mine.pending.clone()].concat();
        let refusal = |m: String, seen| Ok((Some(EngineError::Conflict(m)), seen));
        if above.truncated || mine.truncated {
            return refusal(
                format!("group:{child} or {id} already belongs to the most groups allowed"),
                seen,
            );
        }
        if above.found.iter().any(|g| g == child) {
            return refusal(
                format!("group:{child} already contains {id}: the membership would make a cycle"),
                seen,
            );
        }
        let mut after: BTreeSet<&str> = mine.found.iter().map(String::as_str).collect();
        after.insert(id);
        after.extend(above.found.iter().map(String::as_str));
        if after.len() + 1 > MAX_GROUPS {
            return refusal(
                format!(
                    "members of group:{child} would belong to {} groups; at most {MAX_GROUPS}",
                    after.len() + 1
                ),
                seen,
            );
        }
        let (below, _) = match self.depth_below(snap, child, admit, &mut seen).await {
            Err(EngineError::Conflict(m)) => return refusal(m, seen),
            other => other?,
        };
        let up = self.depth_above(snap, id, admit).await?;
        // A user in the deepest group below `child` walks
        // below + 1 (child) + 1 (id) + up levels.
        if below + up + 2 > MAX_DEPTH {
            return refusal(
                format!(
                    "groups would nest {} levels deep; at most {MAX_DEPTH}",
                    below + up + 2
                ),
                seen,
            );
        }
        Ok((None, seen))
    }

    /// Adds a user or a group to a group (its managers and administrators).
    /// Refuses a membership that would make a cycle, nest groups too deep,
    /// or put anyone in more than [`MAX_GROUPS`] groups.
    pub async fn add_member(&self, caller: &Caller, id: &str, member: &Principal) -> Result<()> {
        match member {
            Principal::User(_) | Principal::Group(_) => {}
            _ => {
                return Err(EngineError::InvalidInput(
                    "only users and groups can be members".into(),
                ))
            }
        }
        // The nesting this request writes pending, if it nests a group:
        // made once, so that a write run again after an unknown outcome
        // knows its own row.
        let mine = (
            Pending {
                stamp: self.now() as u64,
                nonce: crate::random_u64(),
            },
            // A version no other write of the row gives it, so that a
            // guard on it matches this request's row and no later one.
            (crate::random_u64() >> 2).max(2),
        );
        let pending = self
            .retrying(|| async {
                let mut snap = self.snapshot().await?;
                let member_row = match member {
                    Principal::User(u) => schema::user_key(u),
                    Principal::Group(g) => schema::group_key(g),
                    _ => unreachable!("checked above"),
                };
                let m = member.to_string();
                let gets = [
                    schema::group_key(id),
                    member_row,
                    membership_key(&m, id),
                    schema::membership_gate(&m),
                ];
                let (actor, own) = self.resolve(&mut snap, caller, &gets, &[]).await?;
                actor.require_user()?;
                let (group, _) = decode_group(&own.rows[0])?.ok_or_else(|| no_group(id))?;
                if !manages(&actor, &group) {
                    return Err(EngineError::Forbidden(format!(
                        "only a manager of {id} may change it"
                    )));
                }
                if member == &Principal::Group(id.to_string()) {
                    return Err(EngineError::Conflict(
                        "a group cannot contain itself".into(),
                    ));
                }
                if own.rows[1].is_none() {
                    return Err(EngineError::NotFound(format!("no such principal {member}")));
                }
                let key = membership_key(&m, id);
                let held = own.rows[2]
                    .as_ref()
                    .map(|r| (r.version, Pending::of(&r.value)));
                if let Principal::Group(child) = member {
                    // A membership already kept needs no check again.
                    if !matches!(held, Some((_, None))) {
                        return self.nest_pending(&mut snap, id, child, held, mine).await;
                    }
                }
                let above = self
                    .groups_of(&mut snap, &Principal::Group(id.into()))
                    .await?;
                if let Principal::User(_) = member {
                    let mine = self.groups_of(&mut snap, member).await?;
                    let mut after: BTreeSet<&str> = mine.found.iter().map(String::as_str).collect();
                    after.insert(id);
                    after.extend(above.found.iter().map(String::as_str));
                    if above.truncated || mine.truncated {
                        return Err(EngineError::Conflict(format!(
                            "{member} or {id} already belongs to the most groups allowed"
                        )));
                    }
                    if after.len() > MAX_GROUPS {
                        return Err(EngineError::Conflict(format!(
                            "{member} would belong to {} groups; at most {MAX_GROUPS}",
                            after.len()
                        )));
                    }
                }
                // Where the feed ends before the member joins: changes up to
                // there were never the member's through this group. A
                // membership added again keeps its row, and its first join,
                // guarded so that a leave meanwhile is not undone.
                let joined = match held {
                    Some((version, _)) => Err(Expect::Version(version)),
                    None => Ok(membership_value(&snap.feed_end(CHANGES).await?)),
                };
                let gained = std::iter::once(id.to_string()).chain(above.found).collect();
                drop(snap);
                let mut b = Batch::new();
                b.put(member_key(id, &m), schema::MARK.to_vec(), 1);
                match joined {
                    Ok(value) => {
                        b.put(key.clone(), value, 1).guard(key, Expect::Absent);
                        if let Principal::User(_) = member {
                            // Of two new memberships of this user made at
                            // once, the later counts the groups the earlier
                            // gave (its gate moved: read again). A
                            // membership added again gives none, and
                            // leaves the gate.
                            let gate = schema::membership_gate(&m);
                            let (expect, next) = match &own.rows[3] {
                                Some(r) => (Expect::Version(r.version), r.version + 1),
                                None => (Expect::Absent, 1),
                            };
                            b.put(gate.clone(), schema::MARK.to_vec(), next)
                                .guard(gate, expect);
                        }
                    }
                    Err(held) => {
                        b.guard(key, held);
                    }
                };
                crate::changes::record_member(&mut b, self.now(), member, Delta::Gained(gained));
                self.write_changes(b).await?;
                Ok(None)
            })
            .await?;
        match (member, pending) {
            (Principal::Group(child), Some((mine, version))) => {
                // Run to its end even if the request is dropped: a
                // nesting left pending holds up others until it times out.
                let (e, id, child) = (self.clone(), id.to_string(), child.clone());
                tokio::spawn(async move { e.settle_nesting(&id, &child, mine, version).await })
                    .await
                    .map_err(|e| EngineError::Unavailable(format!("nesting check failed: {e}")))?
            }
            _ => Ok(()),
        }
    }

    /// The first step of nesting `child` into `id`, once the caller may:
    /// refuses it if the memberships say so, else writes `mine` pending
    /// (over `held`, a pending nesting of the same groups whose writer is
    /// taken to have stopped, or this request's own from an attempt whose
    /// outcome was unknown). Answers the nesting and its rows' version.
    async fn nest_pending(
        &self,
        snap: &mut Box<dyn Snapshot>,
        id: &str,
        child: &str,
        held: Option<(u64, Option<Pending>)>,
        (mine, version): (Pending, u64),
    ) -> Result<Option<(Pending, u64)>> {
        if held == Some((version, Some(mine))) {
            return Ok(Some((mine, version)));
        }
        if let (Some(refusal), _) = self
            .nesting_refusal(snap, id, child, Admit::Settled)
            .await?
        {
            return Err(refusal);
        }
        let key = membership_key(&format!("group:{child}"), id);
        let expect = match held {
            None => Expect::Absent,
            Some((v, Some(p))) if self.stopped(p, self.now() as u64) => Expect::Version(v),
            // Another request is writing the same row: a write conflict,
            // run again (bounded) until that request is done with it.
            Some(_) => {
                return Err(EngineError::Store(StoreError::Conflict(format!(
                    "group:{child} is being added to {id}"
                ))))
            }
        };
        let mut b = Batch::new();
        b.put(
            member_key(id, &format!("group:{child}")),
            mine.value(),
            version,
        )
        .put(key.clone(), mine.value(), version)
        .guard(key, expect);
        self.store().write(b).await?;
        Ok(Some((mine, version)))
    }

    /// Whether a pending nesting is older than a nesting change takes: its
    /// writer stopped before checking it.
    fn stopped(&self, p: Pending, now: u64) -> bool {
        now.saturating_sub(p.stamp) > self.config().nesting_timeout.as_micros() as u64
    }

    /// The second step of nesting `child` into `id`: checks the pending
    /// nesting `mine` (its rows at `version`) against the memberships and
    /// every other pending nesting, then makes it a membership or takes it
    /// back.
    ///
    /// Each nesting change writes its nesting pending, then reads. Of two
    /// that could close a cycle (or nest too deep, or too wide) together,
    /// the one that reads last sees the other. A change that sees a
    /// conflict with a membership or with an earlier pending nesting is
    /// refused; one whose conflict is only with later pending nestings
    /// waits for them (a bounded time, then it is refused too). So of two,
    /// the later one gives way, and a change that saw no conflict is right
    /// to keep its nesting: any conflicting change it did not see sees it.
    /// A pending nesting makes no one a member; one whose writer stopped
    /// holds up the nestings it conflicts with until it is older than
    /// [`EngineConfig::nesting_timeout`](crate::EngineConfig), when the
    /// next change that meets it removes it (guarded on its version, which
    /// no other write repeats, so that a late writer finds it gone).
    async fn settle_nesting(
        &self,
        id: &str,
        child: &str,
        mine: Pending,
        version: u64,
    ) -> Result<()> {
        let outcome = self.settle_or_refuse(id, child, mine, version).await;
        if outcome.is_err() {
            // Refused, or the store failed: the nesting goes (if the store
            // lets it; else it times out).
            if let Err(e) = self.take_back(id, &format!("group:{child}"), version).await {
                if !matches!(e, StoreError::GuardFailed { .. }) {
                    tracing::warn!(error = %e, "a refused nesting stays pending until it times out");
                }
            }
        }
        outcome.map_err(EngineError::settle)
    }

    /// [`Engine::settle_nesting`] but for taking a refused nesting back.
    async fn settle_or_refuse(
        &self,
        id: &str,
        child: &str,
        mine: Pending,
        version: u64,
    ) -> Result<()> {
        enum Verdict {
            Keep(Vec<u8>, Vec<String>),
            Refuse(EngineError),
            Remove(Vec<Seen>),
            Wait,
            Lost,
        }
        let member = format!("group:{child}");
        let key = membership_key(&member, id);
        for wait in 0..NESTING_WAITS {
            let verdict = self
                .retrying(|| async {
                    let mut snap = self.snapshot().await?;
                    let own = snap.get(&key).await?;
                    if !own.is_some_and(|r| {
                        r.version == version && Pending::of(&r.value) == Some(mine)
                    }) {
                        return Ok(Verdict::Lost);
                    }
                    let (all, seen) = self
                        .nesting_refusal(&mut snap, id, child, Admit::AllBut(mine))
                        .await?;
                    let now = self.now() as u64;
                    // The pending nestings read whose writers stopped.
                    let stopped_of = |seen: Vec<Seen>| -> Vec<Seen> {
                        seen.into_iter()
                            .filter(|s| s.pending != mine && self.stopped(s.pending, now))
                            .collect()
                    };
                    let stopped = stopped_of(seen);
                    if !stopped.is_empty() {
                        return Ok(Verdict::Remove(stopped));
                    }
                    if all.is_none() {
                        let joined = membership_value(&snap.feed_end(CHANGES).await?);
                        let above = self
                            .groups_of(&mut snap, &Principal::Group(id.into()))
                            .await?;
                        let gained: Vec<String> =
                            std::iter::once(id.to_string()).chain(above.found).collect();
                        // The users below, once, as the nesting is kept.
                        let mut seen = Vec::new();
                        let past = self
                            .users_past_the_bound(
                                &mut snap,
                                child,
                                &gained.iter().cloned().collect(),
                                Admit::AllBut(mine),
                                &mut seen,
                            )
                            .await?;
                        let stopped = stopped_of(seen);
                        if !stopped.is_empty() {
                            return Ok(Verdict::Remove(stopped));
                        }
                        if let Some(m) = past {
                            return Ok(Verdict::Refuse(EngineError::Conflict(m)));
                        }
                        return Ok(Verdict::Keep(joined, gained));
                    }
                    // Memberships and earlier pending nestings (this
                    // counts the memberships too).
                    match self
                        .nesting_refusal(&mut snap, id, child, Admit::Before(mine))
                        .await?
                    {
                        (Some(refusal), _) => Ok(Verdict::Refuse(refusal)),
                        (None, _) => Ok(Verdict::Wait),
                    }
                })
                .await?;
            match verdict {
                Verdict::Keep(joined, gained) => {
                    let mut b = Batch::new();
                    b.put(member_key(id, &member), schema::MARK.to_vec(), version + 1)
                        .put(key.clone(), joined, version + 1)
                        .guard(key.clone(), Expect::Version(version));
                    let as_member = Principal::Group(child.to_string());
                    crate::changes::record_member(
                        &mut b,
                        self.now(),
                        &as_member,
                        Delta::Gained(gained),
                    );
                    match self.write_changes(b).await {
                        // Looked at again: kept by an attempt whose outcome
                        // was unknown, or lost.
                        Err(EngineError::Store(StoreError::GuardFailed { .. })) => {
                            if self.kept(&key, version).await? {
                                return Ok(());
                            }
                            continue;
                        }
                        other => return other,
                    }
                }
                Verdict::Refuse(refusal) => return Err(refusal),
                Verdict::Remove(stopped) => {
                    let mut removed = false;
                    for s in stopped {
                        match self.take_back(&s.group, &s.member, s.version).await {
                            Ok(()) => removed = true,
                            Err(StoreError::GuardFailed { .. }) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                    // Removed: look again at once. Else its rows are being
                    // changed (on Cassandra, a write half done that a
                    // reader or the sweeper completes): wait.
                    if !removed {
                        nesting_pause(wait).await;
                    }
                }
                Verdict::Wait => nesting_pause(wait).await,
                Verdict::Lost => {
                    if self.kept(&key, version).await? {
                        return Ok(());
                    }
                    return Err(EngineError::Conflict(format!(
                        "{member} in {id} was changed by another request meanwhile; try again"
                    )));
                }
            }
        }
        Err(EngineError::Conflict(format!(
            "other changes nesting groups near {id} are still being checked; try again"
        )))
    }

    /// Removes the pending nesting of `member` in `group` written at
    /// `version`; `GuardFailed` if its rows are no longer that write's.
    async fn take_back(
        &self,
        group: &str,
        member: &str,
        version: u64,
    ) -> std::result::Result<(), StoreError> {
        let key = membership_key(member, group);
        let mut b = Batch::new();
        b.delete(member_key(group, member))
            .delete(key.clone())
            .guard(key, Expect::Version(version));
        self.store().write(b).await
    }

    /// Whether the membership row `key` is the one this request's nesting
    /// at `version` was kept as.
    async fn kept(&self, key: &Key, version: u64) -> Result<bool> {
        self.retrying(|| async {
            let mut snap = self.snapshot().await?;
            Ok(snap
                .get(key)
                .await?
                .is_some_and(|r| r.version == version + 1 && Pending::of(&r.value).is_none()))
        })
        .await
    }

    /// What a user loses by leaving `id`: the groups it reaches now and
    /// would not reach without that membership. A group's leave says
    /// nothing: each of its members may reach `id` another way.
    async fn lost_by_leaving(
        &self,
        snap: &mut Box<dyn Snapshot>,
        member: &Principal,
        id: &str,
    ) -> Result<Delta> {
        if !matches!(member, Principal::User(_)) {
            return Ok(Delta::Unknown);
        }
        let before = self.groups_of(snap, member).await?;
        let after = self
            .finish_walk(snap, crate::actor::Walk::without(member, id))
            .await?;
        if before.truncated || after.truncated {
            return Ok(Delta::Unknown);
        }
        let kept: BTreeSet<&String> = after.found.iter().collect();
        Ok(Delta::Lost(
            before
                .found
                .iter()
                .filter(|g| !kept.contains(g))
                .cloned()
                .collect(),
        ))
    }

    /// How many levels of groups lie above `group` (0: it is in no group).
    async fn depth_above(
        &self,
        snap: &mut Box<dyn Snapshot>,
        group: &str,
        admit: Admit,
    ) -> Result<usize> {
        let mut walk = Walk::admitting(&Principal::Group(group.to_string()), admit);
        let mut depth = 0;
        while !walk.done() {
            let before = walk.found.len();
            let out = crate::read(snap, &[], &walk.scans()).await?;
            walk.absorb(&out.scans)?;
            if walk.found.len() > before {
                depth += 1;
            }
        }
        Ok(depth)
    }

    /// Removes a member (managers and administrators); any user may remove
    /// themselves: leaving a group is always allowed. Removing a non-member
    /// is not an error.
    pub async fn remove_member(&self, caller: &Caller, id: &str, member: &Principal) -> Result<()> {
        self.retrying(|| async {
            let mut snap = self.snapshot().await?;
            let (actor, group, _) = self.actor_and_group(&mut snap, caller, id).await?;
            let leaving = matches!(member, Principal::User(u) if Some(u.as_str()) == actor.username.as_deref());
            if !leaving && !manages(&actor, &group) {
                return Err(EngineError::Forbidden(format!(
                    "only a manager of {id} may change it"
                )));
            }
            let delta = self.lost_by_leaving(&mut snap, member, id).await?;
            drop(snap);
            let m = member.to_string();
            let mut b = Batch::new();
            b.delete(member_key(id, &m)).delete(membership_key(&m, id));
            crate::changes::record_member(&mut b, self.now(), member, delta);
            self.write_changes(b).await?;
            Ok(())
        })
        .await
    }

    /// A page of a group's direct members, in principal order.
    pub async fn list_members(
        &self,
        caller: &Caller,
        id: &str,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<MemberPage> {
        crate::listing::check_limit(limit)?;
        let key = self.cursor_key().await?;
        let lower = match cursor {
            None => Bound::Unbounded,
            Some(c) => Bound::Excluded(
                unseal(key, members_route(id).as_bytes(), c)
                    .filter(|c| !c.is_empty() && c.len() <= 200)
                    .ok_or_else(|| EngineError::InvalidInput("bad cursor".into()))?,
            ),
        };
        let rows = self
            .retrying(|| async {
                let mut snap = self.snapshot().await?;
                self.actor_and_group(&mut snap, caller, id).await?;
                Ok(snap
                    .scan(
                        &Scan::partition(MEMBERS, id.as_bytes().to_vec(), limit + 1)
                            .bounds(lower.clone(), Bound::Unbounded),
                    )
                    .await?)
            })
            .await?;
        let more = rows.len() > limit;
        let mut members = Vec::with_capacity(limit);
        let mut last = None;
        for row in rows.into_iter().take(limit) {
            if Admit::Settled.admits(&row.value) {
                let s = String::from_utf8(row.clustering.clone())
                    .map_err(|e| crate::error::corrupt("member", e))?;
                members.push(s.parse()?);
            }
            last = Some(row.clustering);
        }
        Ok(MemberPage {
            members,
            next: if more {
                last.map(|l| seal(key, members_route(id).as_bytes(), &l))
            } else {
                None
            },
        })
    }

    /// Adds a manager (a user or a group).
    pub async fn add_manager(
        &self,
        caller: &Caller,
        id: &str,
        manager: &Principal,
    ) -> Result<Group> {
        let exists = match manager {
            Principal::User(u) => schema::user_key(u),
            Principal::Group(g) => schema::group_key(g),
            _ => {
                return Err(EngineError::InvalidInput(
                    "managers are users or groups".into(),
                ))
            }
        };
        self.change_group(caller, id, Some((exists, manager)), |g| {
            if !g.managers.contains(manager) {
                g.managers.push(manager.clone());
            }
            check_managers(&g.managers)
        })
        .await
    }

    /// Removes a manager; the last manager cannot be removed.
    pub async fn remove_manager(
        &self,
        caller: &Caller,
        id: &str,
        manager: &Principal,
    ) -> Result<Group> {
        self.change_group(caller, id, None, |g| {
            g.managers.retain(|p| p != manager);
            check_managers(&g.managers)
        })
        .await
    }

    /// Changes a group's title and properties (its managers and
    /// administrators): a new title replaces the old, and `properties` is an
    /// RFC 7396 merge patch of them.
    pub async fn patch_group(
        &self,
        caller: &Caller,
        id: &str,
        title: Option<String>,
        properties: Option<Map<String, Value>>,
    ) -> Result<Group> {
        self.change_group(caller, id, None, |g| {
            if let Some(t) = &title {
                check_title(t)?;
                g.title = t.clone();
            }
            if let Some(p) = &properties {
                g.properties = crate::model::merged(&g.properties, p);
                self.check_properties(&g.properties)?;
            }
            Ok(())
        })
        .await
    }

    /// Reads a group, changes it (its managers and administrators only) and
    /// writes it back, guarded on the version read (a change that changes
    /// nothing writes nothing). `must_exist` is the row of a principal the
    /// change names, read in the same snapshot: `NotFound` without it.
    async fn change_group(
        &self,
        caller: &Caller,
        id: &str,
        must_exist: Option<(Key, &Principal)>,
        change: impl Fn(&mut Group) -> Result<()>,
    ) -> Result<Group> {
        if !crate::is_valid_name(id) {
            return Err(no_group(id));
        }
        self.retrying(|| async {
            let mut snap = self.snapshot().await?;
            let mut gets = vec![schema::group_key(id)];
            gets.extend(must_exist.as_ref().map(|(k, _)| k.clone()));
            let (actor, own) = self.resolve(&mut snap, caller, &gets, &[]).await?;
            drop(snap);
            actor.require_user()?;
            let (mut group, version) = decode_group(&own.rows[0])?.ok_or_else(|| no_group(id))?;
            if !manages(&actor, &group) {
                return Err(EngineError::Forbidden(format!(
                    "only a manager of {id} may change it"
                )));
            }
            if let Some((_, named)) = must_exist.as_ref().filter(|_| own.rows[1].is_none()) {
                return Err(EngineError::NotFound(format!("no such principal {named}")));
            }
            let before = schema::encode(&group);
            change(&mut group)?;
            let after = schema::encode(&group);
            if after == before {
                return Ok(group);
            }
            let key = schema::group_key(id);
            let mut b = Batch::new();
            b.put(key.clone(), after, version + 1)
                .guard(key, Expect::Version(version));
            self.store().write(b).await?;
            Ok(group)
        })
        .await
    }
}

/// Refuses a group left with no manager, or with too many.
fn check_managers(managers: &[Principal]) -> Result<()> {
    if managers.is_empty() {
        return Err(EngineError::Conflict(
            "a group keeps at least one manager".into(),
        ));
    }
    if managers.len() > MAX_MANAGERS {
        return Err(EngineError::Conflict(format!(
            "a group has at most {MAX_MANAGERS} managers"
        )));
    }
    Ok(())
}

/// Refuses a group title over [`MAX_TITLE`] bytes.
pub(crate) fn check_title(title: &str) -> Result<()> {
    if title.len() > MAX_TITLE {
        return Err(EngineError::InvalidInput(format!(
            "a group title has at most {MAX_TITLE} bytes"
        )));
    }
    Ok(())
}

/// Most bytes of a group's title.
const MAX_TITLE: usize = 1024;

fn too_many_below(group: &str) -> EngineError {
    EngineError::Conflict(format!(
        "too many groups are nested below {group} to nest it further"
    ))
}

/// A members cursor is sealed for its group: another group's cursor is
/// refused, not read as a place in this one.
fn members_route(group: &str) -> String {
    format!("members:{group}")
}

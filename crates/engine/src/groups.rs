//! Groups: members, managers, nesting, and a caller's effective principals.

use std::collections::BTreeSet;
use std::ops::Bound;

use serde_json::{Map, Value};
use tarn_store::{Batch, Expect, Key, Scan};

use crate::error::{EngineError, Result};
use crate::model::check_name;
use crate::schema::{self, MEMBERS, MEMBERSHIPS};
use crate::{b64, unb64, Caller, Engine, Group, Principal};

/// Deepest nesting followed when computing a caller's groups.
pub(crate) const MAX_DEPTH: usize = 32;
/// Most groups one caller may belong to, nesting included.
pub(crate) const MAX_GROUPS: usize = 1000;

/// One page of a group's members.
#[derive(Clone, Debug)]
pub struct MemberPage {
    /// Members in principal order.
    pub members: Vec<Principal>,
    /// Cursor of the next page, if any.
    pub next: Option<String>,
}

impl Engine {
    /// The caller's effective principals: their user, `authenticated`,
    /// `everyone`, and every group they belong to directly or through
    /// nesting. Read from the store on every call; one batch of partition
    /// reads per nesting level, bounded in depth and size.
    pub async fn principals(&self, caller: &Caller) -> Result<Vec<Principal>> {
        let Some(username) = caller.username() else {
            return Ok(vec![Principal::Everyone]);
        };
        let me = Principal::User(username.to_string());
        let groups = self.closure(&me).await?;
        let mut out = vec![me, Principal::Authenticated, Principal::Everyone];
        out.extend(groups.into_iter().map(Principal::Group));
        Ok(out)
    }

    /// Every group that contains `start`, directly or through nesting.
    async fn closure(&self, start: &Principal) -> Result<BTreeSet<String>> {
        let mut seen = BTreeSet::new();
        let mut frontier = vec![start.to_string()];
        for _ in 0..MAX_DEPTH {
            if frontier.is_empty() {
                return Ok(seen);
            }
            let scans = frontier
                .iter()
                .map(|p| Scan::partition(MEMBERSHIPS, p.as_bytes().to_vec(), MAX_GROUPS + 1))
                .collect();
            let mut next = Vec::new();
            for rows in self.store().scan_many(scans).await? {
                for row in rows {
                    let g = String::from_utf8(row.clustering)
                        .map_err(|e| crate::error::corrupt("membership", e))?;
                    if seen.insert(g.clone()) {
                        next.push(format!("group:{g}"));
                    }
                }
            }
            if seen.len() > MAX_GROUPS {
                return Err(EngineError::Conflict(format!(
                    "{start} belongs to more than {MAX_GROUPS} groups"
                )));
            }
            frontier = next;
        }
        if frontier.is_empty() {
            Ok(seen)
        } else {
            Err(EngineError::Conflict(format!(
                "groups of {start} nest deeper than {MAX_DEPTH} levels"
            )))
        }
    }

    pub(crate) async fn read_group(&self, id: &str) -> Result<Option<(Group, u64)>> {
        match self.store().get(schema::group_key(id)).await? {
            Some(row) => Ok(Some((schema::decode("group", &row)?, row.version))),
            None => Ok(None),
        }
    }

    /// Creates a group; its creator becomes its manager.
    pub async fn create_group(
        &self,
        caller: &Caller,
        id: &str,
        title: Option<String>,
        properties: Map<String, Value>,
    ) -> Result<Group> {
        let username = caller.require_user()?;
        check_name("group id", id)?;
        self.check_properties(&properties)?;
        let group = Group {
            id: id.to_string(),
            title: title.unwrap_or_default(),
            properties,
            managers: vec![Principal::User(username.to_string())],
            created_at: self.now(),
            created_by: username.to_string(),
        };
        let key = schema::group_key(id);
        let mut b = Batch::new();
        b.put(key.clone(), schema::encode(&group), 1)
            .guard(key, Expect::Absent);
        match self.store().write(b).await {
            Ok(()) => Ok(group),
            Err(tarn_store::StoreError::GuardFailed { .. }) => {
                Err(EngineError::Conflict(format!("the group {id} exists")))
            }
            Err(e) => Err(EngineError::from(e).settle()),
        }
    }

    /// A group (signed-in callers).
    pub async fn get_group(&self, caller: &Caller, id: &str) -> Result<Group> {
        caller.require_user()?;
        self.read_group(id)
            .await?
            .map(|(g, _)| g)
            .ok_or_else(|| EngineError::NotFound(format!("no group {id}")))
    }

    /// The group, if the caller may manage it.
    async fn managed_group(&self, caller: &Caller, id: &str) -> Result<(Group, u64)> {
        caller.require_user()?;
        let (group, version) = self
            .read_group(id)
            .await?
            .ok_or_else(|| EngineError::NotFound(format!("no group {id}")))?;
        if !caller.is_admin() {
            let mine = self.principals(caller).await?;
            if !group.managers.iter().any(|m| mine.contains(m)) {
                return Err(EngineError::Forbidden(format!(
                    "only a manager of {id} may change it"
                )));
            }
        }
        Ok((group, version))
    }

    /// Checks that a user or group exists.
    pub(crate) async fn check_principal_exists(&self, p: &Principal) -> Result<()> {
        let exists = match p {
            Principal::User(u) => self.read_user(u).await?.is_some(),
            Principal::Group(g) => self.read_group(g).await?.is_some(),
            Principal::Authenticated | Principal::Everyone => true,
        };
        if exists {
            Ok(())
        } else {
            Err(EngineError::NotFound(format!("no such principal {p}")))
        }
    }

    /// Adds a user or a group to a group. Refuses a membership that would
    /// make a cycle.
    pub async fn add_member(&self, caller: &Caller, id: &str, member: &Principal) -> Result<()> {
        self.managed_group(caller, id).await?;
        match member {
            Principal::User(_) => {}
            Principal::Group(g) if g == id => {
                return Err(EngineError::Conflict(
                    "a group cannot contain itself".into(),
                ))
            }
            Principal::Group(_) => {}
            _ => {
                return Err(EngineError::InvalidInput(
                    "only users and groups can be members".into(),
                ))
            }
        }
        self.check_principal_exists(member).await?;
        self.retrying(|| async {
            let mut b = Batch::new();
            if let Principal::Group(child) = member {
                // Nesting changes are serialised on one row, so two
                // concurrent changes cannot close a cycle together.
                let graph = self.store().get(schema::graph_key()).await?;
                let ancestors = self.closure(&Principal::Group(id.to_string())).await?;
                if ancestors.contains(child) {
                    return Err(EngineError::Conflict(format!(
                        "{member} already contains {id}: the membership would make a cycle"
                    )));
                }
                let (expect, version) = match graph {
                    Some(r) => (Expect::Version(r.version), r.version + 1),
                    None => (Expect::Absent, 1),
                };
                b.put(schema::graph_key(), Vec::new(), version)
                    .guard(schema::graph_key(), expect);
            }
            let m = member.to_string();
            b.put(
                Key::new(MEMBERS, id.as_bytes(), m.as_bytes()),
                Vec::new(),
                1,
            )
            .put(
                Key::new(MEMBERSHIPS, m.as_bytes(), id.as_bytes()),
                Vec::new(),
                1,
            );
            self.store().write(b).await?;
            Ok(())
        })
        .await
    }

    /// Removes a member; removing a non-member is not an error.
    pub async fn remove_member(&self, caller: &Caller, id: &str, member: &Principal) -> Result<()> {
        self.managed_group(caller, id).await?;
        let m = member.to_string();
        let mut b = Batch::new();
        b.delete(Key::new(MEMBERS, id.as_bytes(), m.as_bytes()))
            .delete(Key::new(MEMBERSHIPS, m.as_bytes(), id.as_bytes()));
        self.store()
            .write(b)
            .await
            .map_err(|e| EngineError::from(e).settle())
    }

    /// A page of a group's direct members, in principal order.
    pub async fn list_members(
        &self,
        caller: &Caller,
        id: &str,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<MemberPage> {
        self.get_group(caller, id).await?;
        crate::listing::check_limit(limit)?;
        let lower = match cursor {
            None => Bound::Unbounded,
            Some(c) => Bound::Excluded(
                unb64(c).ok_or_else(|| EngineError::InvalidInput("bad cursor".into()))?,
            ),
        };
        let rows = self
            .store()
            .scan(
                Scan::partition(MEMBERS, id.as_bytes().to_vec(), limit + 1)
                    .bounds(lower, Bound::Unbounded),
            )
            .await
            .map_err(|e| EngineError::from(e).settle())?;
        let more = rows.len() > limit;
        let mut members = Vec::with_capacity(limit);
        let mut last = None;
        for row in rows.into_iter().take(limit) {
            let s = String::from_utf8(row.clustering.clone())
                .map_err(|e| crate::error::corrupt("member", e))?;
            members.push(s.parse()?);
            last = Some(row.clustering);
        }
        Ok(MemberPage {
            members,
            next: if more { last.map(|l| b64(&l)) } else { None },
        })
    }

    /// Adds a manager (a user or a group).
    pub async fn add_manager(
        &self,
        caller: &Caller,
        id: &str,
        manager: &Principal,
    ) -> Result<Group> {
        if !matches!(manager, Principal::User(_) | Principal::Group(_)) {
            return Err(EngineError::InvalidInput(
                "managers are users or groups".into(),
            ));
        }
        self.check_principal_exists(manager).await?;
        self.change_managers(caller, id, |m| {
            if !m.contains(manager) {
                m.push(manager.clone());
            }
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
        self.change_managers(caller, id, |m| m.retain(|p| p != manager))
            .await
    }

    async fn change_managers(
        &self,
        caller: &Caller,
        id: &str,
        change: impl Fn(&mut Vec<Principal>),
    ) -> Result<Group> {
        self.retrying(|| async {
            let (mut group, version) = self.managed_group(caller, id).await?;
            change(&mut group.managers);
            if group.managers.is_empty() {
                return Err(EngineError::Conflict(
                    "a group keeps at least one manager".into(),
                ));
            }
            let key = schema::group_key(id);
            let mut b = Batch::new();
            b.put(key.clone(), schema::encode(&group), version + 1)
                .guard(key, Expect::Version(version));
            self.store().write(b).await?;
            Ok(group)
        })
        .await
    }
}

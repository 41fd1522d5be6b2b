//! Items: create, read, merge-patch, delete, share, links.
//!
//! Every operation reads in one snapshot (the caller, the item, the index
//! declarations when it writes, and whatever else it needs, together) and
//! ends in one atomic write: the item, its kind entry and the difference of
//! its index rows, guarded on the item row's revision (a create: on its kind
//! bucket, see [`indexes`](crate::indexes)).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tarn_store::{Batch, Expect, Key, ReadResult, Row, Scan, Snapshot, StoreError};

use crate::actor::Actor;
use crate::error::{EngineError, Result};
use crate::indexes::Defs;
use crate::model::{check_name, normalise_acl};
use crate::schema::{self, ItemRow, ITEMS};
use crate::{
    b64, random_bytes, Caller, Engine, Grant, Item, ItemView, Principal, Properties, Role,
};

/// What an operation reads of an item.
#[derive(Clone, Copy)]
pub(crate) struct ItemWant<'a> {
    /// The item.
    pub id: &'a str,
    /// A link key presented with the request.
    pub link: Option<&'a str>,
    /// Whether the operation writes, so needs the index declarations.
    pub defs: bool,
}

impl<'a> ItemWant<'a> {
    pub(crate) fn read(id: &'a str, link: Option<&'a str>) -> ItemWant<'a> {
        ItemWant {
            id,
            link,
            defs: false,
        }
    }

    pub(crate) fn write(id: &'a str, link: Option<&'a str>) -> ItemWant<'a> {
        ItemWant {
            id,
            link,
            defs: true,
        }
    }
}

/// Most grants in one ACL.
pub(crate) const MAX_GRANTS: usize = 256;
/// Most links one item has at once.
const MAX_LINKS: usize = 100;
/// Links a delete reads and removes, and a listing lists: more than
/// [`MAX_LINKS`], for those that versions before 2026-11-28 let links made
/// at once leave past it (113 were seen).
const LINKS_DELETED: usize = 1_000;

/// The links of an item at revision `rev`, from the rows of
/// [`schema::item_and_links_scan`]: a scan that read another revision of
/// the item than the request did (a write came between the two reads, as
/// it may on Cassandra) is read again.
fn links_at(rows: &[Row], rev: u64) -> Result<&[Row]> {
    match rows.split_first() {
        Some((item, links)) if item.clustering == schema::ITEM_ROW && item.version == rev => {
            Ok(links)
        }
        _ => Err(EngineError::Store(StoreError::Conflict(
            "the item changed while its links were read".into(),
        ))),
    }
}

/// An item as read, with everything needed to decide what the caller may do
/// and to write it back.
pub(crate) struct Access {
    pub item: Item,
    pub role: Role,
    /// The item row's revision: what a write is guarded on.
    pub rev: u64,
    /// The declarations version the item's rows follow.
    pub stamp: u64,
}

fn not_found(id: &str) -> EngineError {
    EngineError::NotFound(format!("no item {id}"))
}

/// Whether `id` could be an item id at all (anything else is simply not
/// found, without a read).
pub(crate) fn plausible_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A link as its manager sees it: never its key, which only its holders
/// know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkInfo {
    /// The SHA-256 of the key, hex: names the link to revoke it.
    pub id: String,
    /// What the link gives.
    pub role: Role,
    /// When it was made (microseconds since the Unix epoch); `None` for a
    /// link made before links kept their time (2026-12-03).
    pub created_at: Option<i64>,
}

/// The id of the link whose key is `key`, as [`Engine::links`] names it.
pub fn link_id(key: &str) -> String {
    crate::hex(&crate::sha256(key.as_bytes()))
}

/// A link's row: what it gives and when it was made. Links made before
/// 2026-12-03 stored the role alone (`"viewer"`), and read as such.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum LinkRow {
    /// What links have stored since 2026-12-03.
    Made {
        role: Role,
        #[serde(rename = "createdAt")]
        created_at: i64,
    },
    /// The role alone, as older links have it.
    Role(Role),
}

impl LinkRow {
    /// The row, or `Corrupt` if it is none or gives more than a link may
    /// (a manager: create and import refuse it, so access and listings
    /// never have to tell it apart).
    pub(crate) fn decode(row: &Row) -> Result<LinkRow> {
        let out: LinkRow = schema::decode("link", row)?;
        match out.role() {
            Role::Viewer | Role::Editor => Ok(out),
            Role::Manager => Err(crate::error::corrupt("link", "a link that gives manager")),
        }
    }

    /// The link of `row` (an `l` row of the item's partition) as its
    /// managers see it.
    pub(crate) fn info(&self, row: &Row) -> LinkInfo {
        LinkInfo {
            id: link_id_of_row(row),
            role: self.role(),
            created_at: self.created_at(),
        }
    }

    pub(crate) fn role(&self) -> Role {
        match self {
            LinkRow::Made { role, .. } | LinkRow::Role(role) => *role,
        }
    }

    pub(crate) fn created_at(&self) -> Option<i64> {
        match self {
            LinkRow::Made { created_at, .. } => Some(*created_at),
            LinkRow::Role(_) => None,
        }
    }
}

/// The id of a link's row: the hex of the key hash after its `l`.
pub(crate) fn link_id_of_row(row: &Row) -> String {
    crate::hex(&row.clustering[1..])
}

/// The row of the link `key` names: the key itself, or the link's id (the
/// 64 lower-case hex digits of its key's SHA-256, which no key the server
/// makes is: those are 32 characters).
fn link_row_named(id: &str, key: &str) -> Option<Key> {
    let is_id = key.len() == 64 && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    match is_id.then(|| crate::unhex(key)).flatten() {
        Some(hash) => Some(schema::link_key_of_hash(id, &hash)),
        None => link_row(id, Some(key)),
    }
}

/// The store key of a link, if the key could be one at all.
fn link_row(id: &str, link: Option<&str>) -> Option<Key> {
    link.filter(|k| !k.is_empty() && k.len() <= 256)
        .map(|k| schema::link_key(id, k))
}

impl Engine {
    /// The caller's role on an item read as `item_row` (with the link row
    /// `link_row` when a key was presented); `NotFound` if none (existence
    /// never leaks).
    pub(crate) fn access(
        &self,
        actor: &Actor,
        id: &str,
        item_row: &Option<Row>,
        link_row: Option<&Option<Row>>,
    ) -> Result<Access> {
        let row = item_row.as_ref().ok_or_else(|| not_found(id))?;
        let stored = ItemRow::decode(row)?;
        let mut role = if actor.admin {
            Some(Role::Manager)
        } else {
            stored.item.role_of(&actor.principals)
        };
        if let Some(Some(link)) = link_row {
            role = role.max(Some(LinkRow::decode(link)?.role()));
        }
        let role = role.ok_or_else(|| not_found(id))?;
        Ok(Access {
            item: stored.item,
            role,
            rev: row.version,
            stamp: stored.stamp,
        })
    }

    /// Reads the caller, an item (and link), and, for a write, the
    /// declarations together in `snap`, plus `gets` and `scans` of the
    /// operation's own.
    pub(crate) async fn read_item_for(
        &self,
        snap: &mut Box<dyn Snapshot>,
        caller: &Caller,
        want: ItemWant<'_>,
        gets: &[Key],
        scans: &[Scan],
    ) -> Result<(Actor, Access, Option<Defs>, ReadResult)> {
        let ItemWant {
            id,
            link,
            defs: with_defs,
        } = want;
        if !plausible_id(id) {
            // Still check the caller, so a bad token answers 401 as
            // everywhere, then answer as for any item one cannot read.
            self.resolve(snap, caller, &[], &[]).await?;
            return Err(not_found(id));
        }
        // The item, its link, then the declarations version only when the
        // operation needs the declarations (a plain read does not).
        let mut all = vec![schema::item_key(id)];
        let link_key = link_row(id, link);
        all.extend(link_key.clone());
        let defs_at = all.len();
        if with_defs {
            all.push(schema::defs_version_key());
        }
        let own_from = all.len();
        all.extend_from_slice(gets);
        let (actor, mut out) = self.resolve(snap, caller, &all, scans).await?;
        let link_answer = link_key.as_ref().map(|_| &out.rows[1]);
        let access = self.access(&actor, id, &out.rows[0], link_answer)?;
        let defs = if with_defs {
            // A write computes from the properties: they must read.
            access.item.properties.check()?;
            let mut defs = self.defs_at(snap, &out.rows[defs_at]).await?;
            if access.stamp > defs.version {
                // Only on a store without snapshots: the item was written
                // with declarations newer than the ones read. Read them
                // again, after the item.
                defs = self.read_defs().await?;
            }
            Some(defs)
        } else {
            None
        };
        let own = ReadResult {
            rows: out.rows.split_off(own_from),
            scans: out.scans,
        };
        Ok((actor, access, defs, own))
    }

    pub(crate) fn require_role(&self, access: &Access, need: Role, what: &str) -> Result<()> {
        if access.role >= need {
            Ok(())
        } else {
            Err(EngineError::Forbidden(format!(
                "{what} needs the role {} on the item; you are {}",
                need.as_str(),
                access.role.as_str()
            )))
        }
    }

    /// Adds to `b` the write of `after` in place of the item read as
    /// `before` (`None`: deleted), with its kind entry and the difference of
    /// its index rows, guarded on the item row's revision.
    pub(crate) fn update_item(
        &self,
        b: &mut Batch,
        defs: &Defs,
        before: &Access,
        after: Option<&Item>,
    ) {
        let key = schema::item_key(&before.item.id);
        b.guard(key.clone(), Expect::Version(before.rev));
        defs.apply_diff(b, Some((&before.item, before.stamp)), after, self.split());
        crate::changes::record_item(b, self.now(), Some(&before.item), after);
        match after {
            Some(item) => {
                b.put(key, schema::encode_item(item, defs.version), before.rev + 1);
            }
            None => {
                b.delete(key);
                b.delete(schema::kind_key(&before.item.kind, &before.item.id));
            }
        }
    }

    /// The keys whose existence an ACL's grants need (users and groups).
    fn grant_keys(acl: &[Grant]) -> Vec<Key> {
        acl.iter()
            .filter_map(|g| match &g.principal {
                Principal::User(u) => Some(schema::user_key(u)),
                Principal::Group(g) => Some(schema::group_key(g)),
                _ => None,
            })
            .collect()
    }

    /// Refuses an ACL naming a user or group that does not exist, given the
    /// answers to [`Engine::grant_keys`].
    fn check_grants_exist(acl: &[Grant], rows: &[Option<Row>]) -> Result<()> {
        let named = acl
            .iter()
            .filter(|g| matches!(g.principal, Principal::User(_) | Principal::Group(_)));
        for (g, row) in named.zip(rows) {
            if row.is_none() {
                return Err(EngineError::InvalidInput(format!(
                    "no such principal {}",
                    g.principal
                )));
            }
        }
        Ok(())
    }

    fn next_modified(&self, old: &Item) -> i64 {
        self.now().max(old.modified_at + 1)
    }

    /// Creates an item; the caller is always one of its managers.
    pub async fn create_item(
        &self,
        caller: &Caller,
        kind: &str,
        properties: Map<String, Value>,
        acl: Vec<Grant>,
    ) -> Result<ItemView> {
        check_name("kind", kind)?;
        crate::users::check_properties_depth(&properties)?;
        let properties = Properties::new(properties);
        self.check_properties_size(properties.text().len())?;
        if acl.len() > MAX_GRANTS {
            return Err(too_many_grants());
        }
        check_managers(&acl)?;
        let id = crate::new_id();
        let bucket = schema::kind_bucket(&id);
        let stamp_key = schema::stamp_key(kind, bucket);
        self.retrying(|| async {
            let mut snap = self.snapshot().await?;
            let mut gets = vec![schema::defs_version_key(), stamp_key.clone()];
            gets.extend(Self::grant_keys(&acl));
            let (actor, own) = self.resolve(&mut snap, caller, &gets, &[]).await?;
            let username = actor.require_user()?.to_string();
            Self::check_grants_exist(&acl, &own.rows[2..])?;
            let defs = self.defs_at(&mut snap, &own.rows[0]).await?;
            drop(snap);
            let mut grants = acl.clone();
            grants.push(Grant {
                principal: Principal::User(username.clone()),
                role: Role::Manager,
            });
            let now = self.now();
            let item = Item {
                id: id.clone(),
                kind: kind.to_string(),
                properties: properties.clone(),
                version: 1,
                created_by: username,
                created_at: now,
                modified_at: now,
                body: None,
                acl: normalise_acl(grants),
            };
            if item.acl.len() > MAX_GRANTS {
                return Err(too_many_grants());
            }
            let mut b = Batch::new();
            // Guards on the kind bucket: the entry is new, and the bucket's
            // stamp is the one read with the declarations (see `indexes`).
            let entry = schema::kind_key(kind, &id);
            b.put(entry.clone(), schema::MARK.to_vec(), 1)
                .guard(entry, Expect::Absent);
            match &own.rows[1] {
                Some(r) => b.guard(stamp_key.clone(), Expect::Version(r.version)),
                // The bucket's first create writes its stamp at 0 (no index
                // of this kind built yet), so later creates guard a row that
                // exists, which a store can let them share, rather than the
                // absence of one, which each would have to claim in turn.
                None => b
                    .put(stamp_key.clone(), schema::MARK.to_vec(), 0)
                    .guard(stamp_key.clone(), Expect::Absent),
            };
            defs.apply_diff(&mut b, None, Some(&item), self.split());
            b.put(
                schema::item_key(&id),
                schema::encode_item(&item, defs.version),
                1,
            );
            crate::changes::record_item(&mut b, now, None, Some(&item));
            self.write_changes(b).await?;
            Ok(ItemView {
                item,
                role: Role::Manager,
            })
        })
        .await
    }

    /// Reads an item the caller may read.
    pub async fn get_item(
        &self,
        caller: &Caller,
        id: &str,
        link: Option<&str>,
    ) -> Result<ItemView> {
        self.retrying(|| async {
            let mut snap = self.snapshot().await?;
            let (_, a, _, _) = self
                .read_item_for(&mut snap, caller, ItemWant::read(id, link), &[], &[])
                .await?;
            Ok(ItemView {
                item: a.item,
                role: a.role,
            })
        })
        .await
    }

    /// Applies an RFC 7396 merge patch to the properties (editors and
    /// managers), if the item is still at `if_match` when given.
    pub async fn patch_item(
        &self,
        caller: &Caller,
        id: &str,
        link: Option<&str>,
        patch: &Value,
        if_match: Option<u64>,
    ) -> Result<ItemView> {
        let Some(patch) = patch.as_object() else {
            return Err(EngineError::InvalidInput(
                "properties patch must be a JSON object".into(),
            ));
        };
        self.retrying(|| async {
            let mut snap = self.snapshot().await?;
            let (_, a, defs, _) = self
                .read_item_for(&mut snap, caller, ItemWant::write(id, link), &[], &[])
                .await?;
            drop(snap);
            let defs = defs.expect("asked for");
            self.require_role(&a, Role::Editor, "changing properties")?;
            check_version(&a.item, if_match)?;
            let props = crate::model::merged(a.item.properties.map(), patch);
            crate::users::check_properties_depth(&props)?;
            let props = Properties::new(props);
            self.check_properties_size(props.text().len())?;
            let mut after = a.item.clone();
            after.properties = props;
            after.version += 1;
            after.modified_at = self.next_modified(&a.item);
            let mut b = Batch::new();
            self.update_item(&mut b, &defs, &a, Some(&after));
            self.write_changes(b).await?;
            Ok(ItemView {
                item: after,
                role: a.role,
            })
        })
        .await
    }

    /// Replaces the ACL (managers). It must keep a manager. `link` is a
    /// link key presented with the request: it makes the item readable, so
    /// its holder is refused (forbidden), not told the item is not there.
    pub async fn set_acl(
        &self,
        caller: &Caller,
        id: &str,
        link: Option<&str>,
        acl: Vec<Grant>,
        if_match: Option<u64>,
    ) -> Result<ItemView> {
        // The one check before access: it bounds what is read with the item.
        let acl = normalise_acl(acl);
        if acl.len() > MAX_GRANTS {
            return Err(too_many_grants());
        }
        let grant_keys = Self::grant_keys(&acl);
        self.retrying(|| async {
            let mut snap = self.snapshot().await?;
            let (actor, a, defs, own) = self
                .read_item_for(
                    &mut snap,
                    caller,
                    ItemWant::write(id, link),
                    &grant_keys,
                    &[],
                )
                .await?;
            drop(snap);
            let defs = defs.expect("asked for");
            self.require_role(&a, Role::Manager, "sharing")?;
            if !acl.iter().any(|g| g.role == Role::Manager) {
                return Err(EngineError::InvalidInput(
                    "an ACL needs at least one manager".into(),
                ));
            }
            check_managers(&acl)?;
            Self::check_grants_exist(&acl, &own.rows)?;
            check_version(&a.item, if_match)?;
            let mut after = a.item.clone();
            after.acl = acl.clone();
            after.version += 1;
            after.modified_at = self.next_modified(&a.item);
            let mut b = Batch::new();
            self.update_item(&mut b, &defs, &a, Some(&after));
            self.write_changes(b).await?;
            let role = if actor.admin {
                Role::Manager
            } else {
                after.role_of(&actor.principals).unwrap_or(Role::Viewer)
            };
            Ok(ItemView { item: after, role })
        })
        .await
    }

    /// Deletes an item (managers) with its index rows and links; its body's
    /// bytes stay for downloads in progress and go after a grace period.
    /// `link`: as for [`Engine::set_acl`].
    pub async fn delete_item(
        &self,
        caller: &Caller,
        id: &str,
        link: Option<&str>,
        if_match: Option<u64>,
    ) -> Result<()> {
        let links = schema::item_and_links_scan(id, LINKS_DELETED);
        self.retrying(|| async {
            let mut snap = self.snapshot().await?;
            let (_, a, defs, own) = self
                .read_item_for(
                    &mut snap,
                    caller,
                    ItemWant::write(id, link),
                    &[],
                    std::slice::from_ref(&links),
                )
                .await?;
            drop(snap);
            let defs = defs.expect("asked for");
            self.require_role(&a, Role::Manager, "deleting")?;
            check_version(&a.item, if_match)?;
            let mut b = Batch::new();
            for row in links_at(&own.scans[0], a.rev)? {
                b.delete(Key::new(ITEMS, id.as_bytes(), row.clustering.clone()));
            }
            if let Some(body) = &a.item.body {
                self.bury_blob(&mut b, &body.blob);
            }
            self.update_item(&mut b, &defs, &a, None);
            self.write_changes(b).await?;
            Ok(())
        })
        .await
    }

    /// Makes a link key giving `role` (viewer or editor) on the item
    /// (managers). The key is shown once; only its hash is stored. `link`:
    /// a key presented with the request, as for [`Engine::set_acl`];
    /// `if_match`: the item's version the caller expects.
    pub async fn create_link(
        &self,
        caller: &Caller,
        id: &str,
        link: Option<&str>,
        role: Role,
        if_match: Option<u64>,
    ) -> Result<String> {
        if role == Role::Manager {
            return Err(EngineError::InvalidInput(
                "a link gives viewer or editor, never manager".into(),
            ));
        }
        let key = b64(&random_bytes::<24>());
        let links = schema::item_and_links_scan(id, MAX_LINKS);
        self.retrying(|| async {
            let (a, own) = self
                .read_links(caller, id, link, &links, "making links")
                .await?;
            check_version(&a.item, if_match)?;
            if links_at(&own.scans[0], a.rev)?.len() >= MAX_LINKS {
                return Err(EngineError::Conflict(format!(
                    "an item has at most {MAX_LINKS} links; remove one first"
                )));
            }
            // The item row is written again, as it is, at its next
            // revision, and guarded on the one its links were counted at:
            // so a link never outlives a delete, and of two links made at
            // once one is counted again, which keeps an item to its bound.
            let item = schema::item_key(id);
            let mut b = Batch::new();
            let row = LinkRow::Made {
                role,
                created_at: self.now(),
            };
            b.put(schema::link_key(id, &key), schema::encode(&row), 1)
                .guard(item.clone(), Expect::Version(a.rev))
                .put(item, schema::encode_item(&a.item, a.stamp), a.rev + 1);
            self.store().write(b).await?;
            Ok(())
        })
        .await?;
        Ok(key)
    }

    /// The item and its links as `links` (an [`schema::item_and_links_scan`])
    /// reads them, in one snapshot, for a manager `doing` something with
    /// them.
    async fn read_links(
        &self,
        caller: &Caller,
        id: &str,
        link: Option<&str>,
        links: &Scan,
        doing: &str,
    ) -> Result<(Access, ReadResult)> {
        let mut snap = self.snapshot().await?;
        let (_, a, _, own) = self
            .read_item_for(
                &mut snap,
                caller,
                ItemWant::read(id, link),
                &[],
                std::slice::from_ref(links),
            )
            .await?;
        drop(snap);
        self.require_role(&a, Role::Manager, doing)?;
        Ok((a, own))
    }

    /// The item's links (managers), the newest first (those from before
    /// links kept their time last), by id on a tie. `link`: a key presented
    /// with the request, as for [`Engine::set_acl`].
    pub async fn links(
        &self,
        caller: &Caller,
        id: &str,
        link: Option<&str>,
    ) -> Result<Vec<LinkInfo>> {
        // Past the bound, for the links that versions before 2026-11-28
        // let pass it: so that each can be seen and revoked.
        let links = schema::item_and_links_scan(id, LINKS_DELETED);
        self.retrying(|| async {
            let (a, own) = self
                .read_links(caller, id, link, &links, "seeing links")
                .await?;
            let mut out = links_at(&own.scans[0], a.rev)?
                .iter()
                .map(|row| Ok(LinkRow::decode(row)?.info(row)))
                .collect::<Result<Vec<_>>>()?;
            out.sort_by(|x, y| {
                y.created_at
                    .cmp(&x.created_at)
                    .then_with(|| x.id.cmp(&y.id))
            });
            Ok(out)
        })
        .await
    }

    /// Removes the link `key` names, its key or its id (managers). `link`:
    /// a key presented with the request, as for [`Engine::set_acl`];
    /// `if_match`: the item's version the caller expects.
    pub async fn delete_link(
        &self,
        caller: &Caller,
        id: &str,
        link: Option<&str>,
        key: &str,
        if_match: Option<u64>,
    ) -> Result<()> {
        // A name no link can have is not found, after the checks any other
        // name meets (so a bad token is still 401, an editor still 403).
        let named = link_row_named(id, key);
        self.retrying(|| async {
            let mut snap = self.snapshot().await?;
            let (_, a, _, own) = self
                .read_item_for(
                    &mut snap,
                    caller,
                    ItemWant::read(id, link),
                    named.as_slice(),
                    &[],
                )
                .await?;
            drop(snap);
            self.require_role(&a, Role::Manager, "removing links")?;
            check_version(&a.item, if_match)?;
            let k = match (&named, own.rows.first()) {
                (Some(k), Some(Some(_))) => k,
                _ => return Err(EngineError::NotFound("no such link".into())),
            };
            let mut b = Batch::new();
            b.delete(k.clone());
            if if_match.is_some() {
                b.guard(schema::item_key(id), Expect::Version(a.rev));
            }
            self.store().write(b).await?;
            Ok(())
        })
        .await
    }
}

/// Refuses an ACL that makes `everyone` or `authenticated` a manager:
/// anyone could then delete the item or take it from its owners. (A
/// group's managers are users or groups too.)
fn check_managers(acl: &[Grant]) -> Result<()> {
    let open = acl.iter().find(|g| {
        g.role == Role::Manager
            && matches!(g.principal, Principal::Everyone | Principal::Authenticated)
    });
    match open {
        Some(g) => Err(EngineError::InvalidInput(format!(
            "{} may be a viewer or an editor, not a manager: managers are users or groups",
            g.principal
        ))),
        None => Ok(()),
    }
}

pub(crate) fn too_many_grants() -> EngineError {
    EngineError::InvalidInput(format!("an ACL holds at most {MAX_GRANTS} grants"))
}

/// The `if_match` of a weak ETag (`W/"3"`): If-Match compares strongly, so
/// it matches no version (none reaches it), after the access checks as any
/// other mismatch.
pub const WEAK_TAG: u64 = u64::MAX;

/// The `if_match` of a strong ETag this server never gives (`"abc"`): it
/// matches no version either.
pub const FOREIGN_TAG: u64 = u64::MAX - 1;

pub(crate) fn check_version(item: &Item, if_match: Option<u64>) -> Result<()> {
    match if_match {
        Some(v) if v != item.version => Err(EngineError::VersionMismatch {
            expected: v,
            current: item.version,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(value: &[u8]) -> Row {
        Row {
            clustering: vec![b'l'],
            value: value.to_vec(),
            version: 1,
        }
    }

    #[test]
    fn link_rows_read_with_their_time_and_without() {
        let old = LinkRow::decode(&row(br#""editor""#)).unwrap();
        assert_eq!((old.role(), old.created_at()), (Role::Editor, None));
        let made = LinkRow::Made {
            role: Role::Viewer,
            created_at: 7,
        };
        // The bytes rows are written with: a rename would lose them.
        assert_eq!(schema::encode(&made), br#"{"role":"viewer","createdAt":7}"#);
        let new = LinkRow::decode(&row(&schema::encode(&made))).unwrap();
        assert_eq!((new.role(), new.created_at()), (Role::Viewer, Some(7)));
        assert!(LinkRow::decode(&row(br#"{"role":"viewer"}"#)).is_err());
        assert!(LinkRow::decode(&row(br#""manager""#)).is_err());
    }

    #[test]
    fn a_link_is_named_by_its_key_or_its_id() {
        let key = "eRXW0WK3KQOxUooepKFfmb4flLesGxlj";
        let by_key = link_row_named("i", key).unwrap();
        let id = link_id(key);
        assert_eq!(link_row_named("i", &id).unwrap(), by_key);
        // Anything else of 64 characters is a key, hashed: upper-case hex
        // too, and other characters.
        let key_of = |k: &str| schema::link_key("i", k);
        let upper = id.to_ascii_uppercase();
        assert_eq!(link_row_named("i", &upper), Some(key_of(&upper)));
        let other = format!("g{}", &id[1..]);
        assert_eq!(link_row_named("i", &other), Some(key_of(&other)));
        assert_eq!(link_row_named("i", ""), None);
    }
}

//! Items: create, read, merge-patch, delete, share, links.
//!
//! Every change is one atomic write guarded on the item row's version: the
//! item, its kind entry and the difference of its index rows together.

use serde_json::{Map, Value};
use tarn_store::{Batch, Expect, Scan};

use crate::error::{EngineError, Result};
use crate::indexes::{apply_diff, Defs};
use crate::model::{check_name, normalise_acl};
use crate::schema::{self, ITEMS};
use crate::{
    b64, merge_patch, random_bytes, Caller, Engine, Grant, Item, ItemView, Principal, Role,
};

/// An item as read, with everything needed to decide what the caller may do.
pub(crate) struct Access {
    pub item: Item,
    pub role: Role,
}

impl Engine {
    pub(crate) async fn read_item(&self, id: &str) -> Result<Option<(Item, u64)>> {
        if id.is_empty() || id.len() > 64 {
            return Ok(None);
        }
        match self.store().get(schema::item_key(id)).await? {
            Some(row) => Ok(Some((schema::decode("item", &row)?, row.version))),
            None => Ok(None),
        }
    }

    /// The caller's role on an item, through its principals, a link key, or
    /// being an administrator; `NotFound` if none (existence never leaks).
    pub(crate) async fn access(
        &self,
        caller: &Caller,
        id: &str,
        link: Option<&str>,
    ) -> Result<Access> {
        let not_found = || EngineError::NotFound(format!("no item {id}"));
        let (item, _) = self.read_item(id).await?.ok_or_else(not_found)?;
        let mut role = if caller.is_admin() {
            Some(Role::Manager)
        } else {
            item.role_of(&self.principals(caller).await?)
        };
        if let Some(key) = link {
            if let Some(row) = self.store().get(schema::link_key(id, key)).await? {
                let link_role: Role = schema::decode("link", &row)?;
                role = role.max(Some(link_role));
            }
        }
        let role = role.ok_or_else(not_found)?;
        Ok(Access { item, role })
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

    /// Writes `after` in place of `before` (either may be `None`), with its
    /// kind entry and index rows, guarded on the version `before` was read
    /// at. `extra` adds changes of its own (links, ...).
    pub(crate) async fn write_item(
        &self,
        defs: &Defs,
        before: Option<&Item>,
        after: Option<&Item>,
        extra: Batch,
    ) -> Result<()> {
        let mut b = extra;
        let (id, kind) = match (before, after) {
            (_, Some(i)) | (Some(i), None) => (i.id.as_str(), i.kind.as_str()),
            (None, None) => return Ok(()),
        };
        let key = schema::item_key(id);
        b.guard(
            key.clone(),
            match before {
                Some(i) => Expect::Version(i.version),
                None => Expect::Absent,
            },
        );
        match after {
            Some(item) => {
                b.put(key, schema::encode(item), item.version);
                if before.is_none() {
                    b.put(schema::kind_key(kind, id), Vec::new(), 1);
                }
            }
            None => {
                b.delete(key);
                b.delete(schema::kind_key(kind, id));
            }
        }
        apply_diff(&mut b, &defs.defs, before, after);
        self.check_lease(defs)?;
        self.store().write(b).await?;
        Ok(())
    }

    /// Checks every grant's principal exists and returns the normalised ACL.
    async fn check_acl(&self, acl: Vec<Grant>) -> Result<Vec<Grant>> {
        let acl = normalise_acl(acl);
        if acl.len() > 256 {
            return Err(EngineError::InvalidInput(
                "an ACL holds at most 256 grants".into(),
            ));
        }
        for g in &acl {
            match self.check_principal_exists(&g.principal).await {
                Ok(()) => {}
                Err(EngineError::NotFound(m)) => return Err(EngineError::InvalidInput(m)),
                Err(e) => return Err(e.settle()),
            }
        }
        Ok(acl)
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
        let username = caller.require_user()?.to_string();
        check_name("kind", kind)?;
        self.check_properties(&properties)?;
        let mut acl = acl;
        acl.push(Grant {
            principal: Principal::User(username.clone()),
            role: Role::Manager,
        });
        let acl = self.check_acl(acl).await?;
        let now = self.now();
        let item = Item {
            id: b64(&random_bytes::<16>()),
            kind: kind.to_string(),
            properties,
            version: 1,
            created_by: username,
            created_at: now,
            modified_at: now,
            body: None,
            acl,
        };
        self.retrying(|| async {
            let defs = self.index_defs().await?;
            self.write_item(&defs, None, Some(&item), Batch::new())
                .await
        })
        .await?;
        Ok(ItemView {
            item,
            role: Role::Manager,
        })
    }

    /// Reads an item the caller may read.
    pub async fn get_item(
        &self,
        caller: &Caller,
        id: &str,
        link: Option<&str>,
    ) -> Result<ItemView> {
        let a = self.retrying(|| self.access(caller, id, link)).await?;
        Ok(ItemView {
            item: a.item,
            role: a.role,
        })
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
        if !patch.is_object() {
            return Err(EngineError::InvalidInput(
                "properties patch must be a JSON object".into(),
            ));
        }
        self.retrying(|| async {
            let defs = self.index_defs().await?;
            let a = self.access(caller, id, link).await?;
            self.require_role(&a, Role::Editor, "changing properties")?;
            check_version(&a.item, if_match)?;
            let mut props = Value::Object(a.item.properties.clone());
            merge_patch(&mut props, patch);
            let Value::Object(props) = props else {
                unreachable!("an object patched by an object stays an object")
            };
            self.check_properties(&props)?;
            let mut after = a.item.clone();
            after.properties = props;
            after.version += 1;
            after.modified_at = self.next_modified(&a.item);
            self.write_item(&defs, Some(&a.item), Some(&after), Batch::new())
                .await?;
            Ok(ItemView {
                item: after,
                role: a.role,
            })
        })
        .await
    }

    /// Replaces the ACL (managers). It must keep a manager.
    pub async fn set_acl(
        &self,
        caller: &Caller,
        id: &str,
        acl: Vec<Grant>,
        if_match: Option<u64>,
    ) -> Result<ItemView> {
        if !acl.iter().any(|g| g.role == Role::Manager) {
            return Err(EngineError::InvalidInput(
                "an ACL needs at least one manager".into(),
            ));
        }
        let acl = self.check_acl(acl).await?;
        self.retrying(|| async {
            let defs = self.index_defs().await?;
            let a = self.access(caller, id, None).await?;
            self.require_role(&a, Role::Manager, "sharing")?;
            check_version(&a.item, if_match)?;
            let mut after = a.item.clone();
            after.acl = acl.clone();
            after.version += 1;
            after.modified_at = self.next_modified(&a.item);
            self.write_item(&defs, Some(&a.item), Some(&after), Batch::new())
                .await?;
            let role = if caller.is_admin() {
                Role::Manager
            } else {
                after
                    .role_of(&self.principals(caller).await?)
                    .unwrap_or(Role::Viewer)
            };
            Ok(ItemView { item: after, role })
        })
        .await
    }

    /// Deletes an item (managers) with its index rows, links and body.
    pub async fn delete_item(
        &self,
        caller: &Caller,
        id: &str,
        if_match: Option<u64>,
    ) -> Result<()> {
        let body = self
            .retrying(|| async {
                let defs = self.index_defs().await?;
                let a = self.access(caller, id, None).await?;
                self.require_role(&a, Role::Manager, "deleting")?;
                check_version(&a.item, if_match)?;
                // Links live in the item's partition; an item has few.
                let links = self
                    .store()
                    .scan(Scan::partition(ITEMS, id.as_bytes().to_vec(), 10_000))
                    .await?;
                let mut extra = Batch::new();
                for row in links.into_iter().filter(|r| !r.clustering.is_empty()) {
                    extra.delete(tarn_store::Key::new(ITEMS, id.as_bytes(), row.clustering));
                }
                self.write_item(&defs, Some(&a.item), None, extra).await?;
                Ok(a.item.body)
            })
            .await?;
        if let Some(body) = body {
            // The item is gone; chunks that cannot be removed now are only
            // unreachable space, so the delete still succeeded.
            if let Err(e) = self.delete_blob(&body.blob).await {
                tracing::error!(item_id = %id, blob = %body.blob, error = %e, "body chunks left behind");
            }
        }
        Ok(())
    }

    /// Makes a link key giving `role` (viewer or editor) on the item
    /// (managers). The key is shown once; only its hash is stored.
    pub async fn create_link(&self, caller: &Caller, id: &str, role: Role) -> Result<String> {
        if role == Role::Manager {
            return Err(EngineError::InvalidInput(
                "a link gives viewer or editor, never manager".into(),
            ));
        }
        let key = b64(&random_bytes::<24>());
        self.retrying(|| async {
            let a = self.access(caller, id, None).await?;
            self.require_role(&a, Role::Manager, "making links")?;
            let mut b = Batch::new();
            // Guarded on the item's version: a link never outlives a delete.
            b.put(schema::link_key(id, &key), schema::encode(&role), 1)
                .guard(schema::item_key(id), Expect::Version(a.item.version));
            self.store().write(b).await?;
            Ok(())
        })
        .await?;
        Ok(key)
    }

    /// Removes a link key (managers).
    pub async fn delete_link(&self, caller: &Caller, id: &str, key: &str) -> Result<()> {
        let a = self.retrying(|| self.access(caller, id, None)).await?;
        self.require_role(&a, Role::Manager, "removing links")?;
        let k = schema::link_key(id, key);
        if self.store().get(k.clone()).await?.is_none() {
            return Err(EngineError::NotFound("no such link".into()));
        }
        let mut b = Batch::new();
        b.delete(k);
        self.store()
            .write(b)
            .await
            .map_err(|e| EngineError::from(e).settle())
    }
}

pub(crate) fn check_version(item: &Item, if_match: Option<u64>) -> Result<()> {
    match if_match {
        Some(v) if v != item.version => Err(EngineError::VersionMismatch {
            expected: v,
            current: item.version,
        }),
        _ => Ok(()),
    }
}

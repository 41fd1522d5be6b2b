//! Item bodies, stored in chunks through the store contract and streamed in
//! and out: a body is never whole in memory.
//!
//! An upload writes its chunks under a fresh blob id, then one atomic write
//! points the item at the new blob; the old blob's chunks are removed after.
//! Readers of the old version keep reading it until then.

use std::ops::Bound;

use sha2::Digest;
use tarn_store::{Batch, Scan};

use crate::error::{EngineError, Result};
use crate::items::check_version;
use crate::schema::{self, BLOBS};
use crate::{b64, random_bytes, BodyMeta, Caller, Engine, ItemView, Role};

/// Bytes per stored chunk.
const CHUNK: usize = 256 * 1024;
/// Chunks written per store write, and read per store read.
const CHUNKS_PER_IO: usize = 4;

/// An upload in progress. Write the bytes with [`BodyUpload::write`], then
/// [`BodyUpload::finish`]. Dropped unfinished, its chunks are removed.
pub struct BodyUpload {
    engine: Engine,
    caller: Caller,
    link: Option<String>,
    item_id: String,
    blob: String,
    content_type: String,
    buf: Vec<u8>,
    next_chunk: u64,
    size: u64,
    hasher: sha2::Sha256,
    done: bool,
}

/// A byte range of a body: `start..end`, end exclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyRange {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

/// Streams a body (or a range of it) in chunks.
pub struct BodyReader {
    engine: Engine,
    blob: String,
    chunk: u64,
    pos: u64,
    end: u64,
}

impl Engine {
    /// Starts replacing an item's body (editors and managers).
    pub async fn begin_body(
        &self,
        caller: &Caller,
        id: &str,
        link: Option<&str>,
        content_type: &str,
    ) -> Result<BodyUpload> {
        if content_type.is_empty() || content_type.len() > 255 {
            return Err(EngineError::InvalidInput(
                "a body needs a Content-Type".into(),
            ));
        }
        let a = self.retrying(|| self.access(caller, id, link)).await?;
        self.require_role(&a, Role::Editor, "uploading a body")?;
        Ok(BodyUpload {
            engine: self.clone(),
            caller: caller.clone(),
            link: link.map(str::to_string),
            item_id: id.to_string(),
            blob: b64(&random_bytes::<16>()),
            content_type: content_type.to_string(),
            buf: Vec::with_capacity(CHUNK * CHUNKS_PER_IO),
            next_chunk: 0,
            size: 0,
            hasher: sha2::Sha256::new(),
            done: false,
        })
    }

    /// Opens an item's body for reading (viewers and up). `None` if the item
    /// has no body.
    pub async fn open_body(
        &self,
        caller: &Caller,
        id: &str,
        link: Option<&str>,
    ) -> Result<(ItemView, Option<BodyReader>)> {
        let view = self.get_item(caller, id, link).await?;
        let reader = view.item.body.as_ref().map(|b| BodyReader {
            engine: self.clone(),
            blob: b.blob.clone(),
            chunk: u64::from(b.chunk),
            pos: 0,
            end: b.size,
        });
        Ok((view, reader))
    }

    /// Removes a blob's chunks in bounded batches.
    pub(crate) async fn delete_blob(&self, blob: &str) -> Result<()> {
        loop {
            let rows = self
                .store()
                .scan(Scan::partition(BLOBS, blob.as_bytes().to_vec(), 64))
                .await?;
            if rows.is_empty() {
                return Ok(());
            }
            let mut b = Batch::new();
            for r in rows {
                b.delete(tarn_store::Key::new(BLOBS, blob.as_bytes(), r.clustering));
            }
            self.store().write(b).await?;
        }
    }
}

impl BodyUpload {
    /// Adds bytes; full chunks go to the store as they fill.
    pub async fn write(&mut self, data: &[u8]) -> Result<()> {
        self.size += data.len() as u64;
        if self.size > self.engine.config().max_body {
            return Err(EngineError::TooLarge(format!(
                "a body is at most {} bytes",
                self.engine.config().max_body
            )));
        }
        self.hasher.update(data);
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK * CHUNKS_PER_IO {
            self.flush(false).await?;
        }
        Ok(())
    }

    /// Writes every full chunk held (all of them if `last`).
    async fn flush(&mut self, last: bool) -> Result<()> {
        let full = if last {
            self.buf.len()
        } else {
            self.buf.len() / CHUNK * CHUNK
        };
        if full == 0 {
            return Ok(());
        }
        let mut b = Batch::new();
        for piece in self.buf[..full].chunks(CHUNK) {
            b.put(
                schema::chunk_key(&self.blob, self.next_chunk),
                piece.to_vec(),
                1,
            );
            self.next_chunk += 1;
        }
        self.buf.drain(..full);
        self.engine
            .store()
            .write(b)
            .await
            .map_err(|e| EngineError::from(e).settle())
    }

    /// Stores the last bytes and points the item at the new body, if the
    /// item is still at `if_match` when given.
    pub async fn finish(mut self, if_match: Option<u64>) -> Result<ItemView> {
        self.flush(true).await?;
        let meta = BodyMeta {
            size: self.size,
            content_type: self.content_type.clone(),
            sha256: hex(&std::mem::take(&mut self.hasher).finalize()),
            blob: self.blob.clone(),
            chunk: CHUNK as u32,
        };
        let engine = self.engine.clone();
        let (view, old) = engine
            .retrying(|| async {
                let defs = engine.index_defs().await?;
                let a = engine
                    .access(&self.caller, &self.item_id, self.link.as_deref())
                    .await?;
                engine.require_role(&a, Role::Editor, "uploading a body")?;
                check_version(&a.item, if_match)?;
                let mut after = a.item.clone();
                after.body = Some(meta.clone());
                after.version += 1;
                after.modified_at = engine.now().max(a.item.modified_at + 1);
                engine
                    .write_item(&defs, Some(&a.item), Some(&after), Batch::new())
                    .await?;
                Ok((
                    ItemView {
                        item: after,
                        role: a.role,
                    },
                    a.item.body,
                ))
            })
            .await?;
        self.done = true;
        if let Some(old) = old {
            // The new body is in place; old chunks that cannot be removed
            // now are only unreachable space.
            if let Err(e) = engine.delete_blob(&old.blob).await {
                tracing::error!(blob = %old.blob, error = %e, "old body chunks left behind");
            }
        }
        Ok(view)
    }
}

impl Drop for BodyUpload {
    fn drop(&mut self) {
        if self.done || self.next_chunk == 0 {
            return;
        }
        // Unfinished (error, client gone): remove what was written.
        let engine = self.engine.clone();
        let blob = std::mem::take(&mut self.blob);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = engine.delete_blob(&blob).await {
                    tracing::warn!(blob = %blob, error = %e, "could not remove an abandoned upload");
                }
            });
        }
    }
}

impl BodyReader {
    /// Restricts reading to `range` (already checked against the size).
    pub fn seek(&mut self, range: BodyRange) {
        self.pos = range.start.min(self.end);
        self.end = range.end.min(self.end).max(self.pos);
    }

    /// The next bytes, or `None` at the end. Reads a few chunks at a time.
    pub async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>> {
        if self.pos >= self.end {
            return Ok(None);
        }
        let first = self.pos / self.chunk;
        let rows = self
            .engine
            .store()
            .scan(
                Scan::partition(BLOBS, self.blob.as_bytes().to_vec(), CHUNKS_PER_IO).bounds(
                    Bound::Included(first.to_be_bytes().to_vec()),
                    Bound::Unbounded,
                ),
            )
            .await
            .map_err(|e| EngineError::from(e).settle())?;
        let mut out = Vec::with_capacity(CHUNK * rows.len());
        for (expect, row) in (first..).zip(rows) {
            let n = u64::from_be_bytes(
                row.clustering
                    .as_slice()
                    .try_into()
                    .map_err(|_| crate::error::corrupt("chunk key", "length"))?,
            );
            if n != expect {
                return Err(crate::error::corrupt(
                    "body",
                    format!("chunk {expect} missing"),
                ));
            }
            let chunk_start = n * self.chunk;
            let from = (self.pos.saturating_sub(chunk_start)) as usize;
            let to = ((self.end - chunk_start) as usize).min(row.value.len());
            if from < to {
                out.extend_from_slice(&row.value[from..to]);
            }
            if chunk_start + row.value.len() as u64 >= self.end {
                break;
            }
        }
        if out.is_empty() {
            return Err(crate::error::corrupt("body", "shorter than its size"));
        }
        self.pos += out.len() as u64;
        Ok(Some(out))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

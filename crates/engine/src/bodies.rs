//! Item bodies, stored in chunks through the store contract and streamed in
//! and out: a body is never whole in memory.
//!
//! An upload writes its chunks under a fresh blob id as they fill (each
//! chunk write is its own small transaction, so the store's writer is never
//! held while bytes arrive), then one atomic write points the item at the
//! new blob. Bytes are never removed at once: a replaced or deleted body's
//! blob goes to the *graveyard* with a due time (`body_grace` later), so a
//! download that started before the change reads to its end; a node's
//! sweeper removes due blobs in bounded batches. An upload registers its
//! blob in the graveyard with its first chunks (due a day later) and takes
//! it out when it lands, so the bytes of an upload whose node stopped
//! mid-way are removed too.
//!
//! Uploads take turns at a node's few upload places while they hash and
//! store, and rest at them in proportion to the time they worked
//! (`EngineConfig::upload_share`): a node busy with uploads keeps most of
//! its CPU for readers, and an upload's client is slowed by TCP flow
//! control rather than buffered.

use std::ops::Bound;
use std::time::{Duration, Instant};

use sha2::Digest;
use tarn_store::{Batch, Key, Scan, SnapshotExt};

use crate::error::{EngineError, Result};
use crate::items::{check_version, ItemWant};
use crate::schema::{self, BLOBS, GRAVEYARD};
use crate::{BodyMeta, Caller, Engine, ItemView, Role};

/// Bytes per stored chunk.
const CHUNK: usize = 256 * 1024;
/// Chunks written per store write, and read per store read.
const CHUNKS_PER_IO: usize = 4;
/// How long an upload may take before its bytes are swept as abandoned.
const UPLOAD_DEADLINE: Duration = Duration::from_secs(24 * 3600);
const HOUR_MICROS: i64 = 3600 * 1_000_000;
/// The shortest rest an upload takes: shorter debts add up until they are
/// worth a timer.
const MIN_REST: Duration = Duration::from_millis(2);

/// An upload in progress. Write the bytes with [`BodyUpload::write`], then
/// [`BodyUpload::finish`]. Dropped unfinished, its chunks are removed.
pub struct BodyUpload {
    engine: Engine,
    caller: Caller,
    link: Option<String>,
    item_id: String,
    blob: String,
    /// The upload's own graveyard entry, removed when it lands.
    pending: Key,
    content_type: String,
    buf: Vec<u8>,
    /// The first bytes of a textual body, for text indexes on `$body`.
    text: Option<Vec<u8>>,
    next_chunk: u64,
    size: u64,
    hasher: sha2::Sha256,
    /// Whether chunks (and the graveyard entry with them) were written.
    stored: bool,
    /// Rest this upload owes its place (see `EngineConfig::upload_share`).
    owed: Duration,
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

/// Streams a body (or a range of it) in chunks, each read in a snapshot of
/// its own: a long download holds no transaction open.
pub struct BodyReader {
    engine: Engine,
    blob: String,
    chunk: u64,
    pos: u64,
    end: u64,
}

/// The graveyard entry of `blob` due at `due` (microseconds).
fn grave_key(blob: &str, due: i64) -> Key {
    let hour = (due.max(0) / HOUR_MICROS) as u64;
    let mut part = b"g".to_vec();
    part.extend_from_slice(&hour.to_be_bytes());
    let mut clus = due.max(0).to_be_bytes().to_vec();
    clus.extend_from_slice(blob.as_bytes());
    Key::new(GRAVEYARD, part, clus)
}

impl Engine {
    /// Starts replacing an item's body (editors and managers). With
    /// `if_match`, an item at another version is refused here, before a
    /// byte is sent, as well as when the upload finishes.
    pub async fn begin_body(
        &self,
        caller: &Caller,
        id: &str,
        link: Option<&str>,
        content_type: &str,
        if_match: Option<u64>,
    ) -> Result<BodyUpload> {
        check_content_type(content_type)?;
        let a = self
            .retrying(|| async {
                let mut snap = self.snapshot().await?;
                let (_, a, _, _) = self
                    .read_item_for(&mut snap, caller, ItemWant::read(id, link), &[], &[])
                    .await?;
                Ok(a)
            })
            .await?;
        self.require_role(&a, Role::Editor, "uploading a body")?;
        check_version(&a.item, if_match)?;
        let blob = crate::new_id();
        let pending = grave_key(&blob, self.now() + UPLOAD_DEADLINE.as_micros() as i64);
        self.count_upload(1);
        Ok(BodyUpload {
            engine: self.clone(),
            caller: caller.clone(),
            link: link.map(str::to_string),
            item_id: id.to_string(),
            blob,
            pending,
            content_type: content_type.to_string(),
            buf: Vec::with_capacity(CHUNK * CHUNKS_PER_IO),
            text: crate::search::is_textual(content_type).then(Vec::new),
            next_chunk: 0,
            size: 0,
            hasher: sha2::Sha256::new(),
            stored: false,
            owed: Duration::ZERO,
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

    /// Adds to `b` the burial of a blob: its bytes go once the grace is over.
    pub(crate) fn bury_blob(&self, b: &mut Batch, blob: &str) {
        let due = self.now() + self.config().body_grace.as_micros() as i64;
        b.put(grave_key(blob, due), blob.as_bytes().to_vec(), 1);
    }

    /// Removes a blob's chunks in bounded batches.
    async fn delete_blob(&self, blob: &str) -> Result<()> {
        loop {
            let rows = self
                .snapshot()
                .await?
                .scan(&Scan::partition(BLOBS, blob.as_bytes().to_vec(), 64))
                .await?;
            if rows.is_empty() {
                return Ok(());
            }
            let mut b = Batch::new();
            for r in rows {
                b.delete(Key::new(BLOBS, blob.as_bytes(), r.clustering));
            }
            self.store().write(b).await?;
        }
    }

    /// Starts this node's sweeper of due graveyard entries.
    pub(crate) fn resume_sweeps(&self) {
        let engine = self.clone();
        tokio::spawn(async move {
            let mut hour = engine.now() / HOUR_MICROS - 48;
            loop {
                match engine.sweep_from(hour).await {
                    Ok(next) => hour = next,
                    Err(e) => tracing::warn!(error = %e, "the body sweeper will try again"),
                }
                tokio::time::sleep(engine.config().sweep_every).await;
            }
        });
    }

    /// Removes every blob due by now whose entry lies in `hour` or later;
    /// answers the first hour that may still hold entries not yet due.
    pub async fn sweep_from(&self, hour: i64) -> Result<i64> {
        let now = self.now();
        let now_hour = now / HOUR_MICROS;
        let mut hour = hour.max(0);
        while hour <= now_hour {
            let mut part = b"g".to_vec();
            part.extend_from_slice(&(hour as u64).to_be_bytes());
            loop {
                let due = self
                    .retrying(|| async {
                        Ok(self
                            .snapshot()
                            .await?
                            .scan(&Scan::partition(GRAVEYARD, part.clone(), 64).bounds(
                                Bound::Unbounded,
                                Bound::Excluded(now.to_be_bytes().to_vec()),
                            ))
                            .await?)
                    })
                    .await?;
                if due.is_empty() {
                    break;
                }
                for row in due {
                    let blob = String::from_utf8(row.value.clone())
                        .map_err(|e| crate::error::corrupt("graveyard entry", e))?;
                    self.retrying(|| self.delete_blob(&blob)).await?;
                    let mut b = Batch::new();
                    b.delete(Key::new(GRAVEYARD, part.clone(), row.clustering.clone()));
                    self.retrying(|| async { Ok(self.store().write(b.clone()).await?) })
                        .await?;
                }
            }
            if hour == now_hour {
                break;
            }
            hour += 1;
        }
        Ok(now_hour)
    }
}

impl BodyUpload {
    /// Adds bytes; full chunks go to the store as they fill. Waits for one
    /// of the node's upload places while it hashes and stores them.
    pub async fn write(&mut self, data: &[u8]) -> Result<()> {
        let engine = self.engine.clone();
        let slot = engine.upload_place().await?;
        let began = Instant::now();
        self.size += data.len() as u64;
        if self.size > self.engine.config().max_body {
            return Err(EngineError::TooLarge(format!(
                "a body is at most {} bytes",
                self.engine.config().max_body
            )));
        }
        self.hasher.update(data);
        if let Some(t) = &mut self.text {
            let room = crate::search::BODY_READ.saturating_sub(t.len());
            t.extend_from_slice(&data[..room.min(data.len())]);
        }
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK * CHUNKS_PER_IO {
            self.flush(false).await?;
        }
        self.rest(began, false).await;
        drop(slot);
        Ok(())
    }

    /// Owes the place a rest for the time it was held since `began`, and
    /// rests (still holding it) once the debt is worth a timer, or when
    /// `settle`: so uploads keep the place busy at most
    /// `EngineConfig::upload_share` of the time while the node serves
    /// others. Alone, they owe nothing.
    async fn rest(&mut self, began: Instant, settle: bool) {
        let share = self.engine.config().upload_share.clamp(0.01, 1.0);
        if share >= 1.0 || !self.engine.serving_others() {
            self.owed = Duration::ZERO;
            return;
        }
        self.owed += began.elapsed().mul_f64((1.0 - share) / share);
        if self.owed >= MIN_REST || (settle && !self.owed.is_zero()) {
            let rest = std::mem::take(&mut self.owed);
            self.engine.count_upload_rest(rest);
            tokio::time::sleep(rest).await;
        }
    }

    /// Writes every full chunk held (all of them if `last`); the first
    /// write also registers the blob in the graveyard, so its bytes are
    /// removed if the upload never lands.
    async fn flush(&mut self, last: bool) -> Result<()> {
        let full = if last {
            self.buf.len()
        } else {
            self.buf.len() / CHUNK * CHUNK
        };
        if full == 0 {
            return Ok(());
        }
        let register = !self.stored;
        let first = self.next_chunk;
        // Set before writing: a write whose outcome is unknown may have
        // stored chunks, which dropping the upload must then remove.
        self.stored = true;
        let (engine, blob, pending, bytes) =
            (&self.engine, &self.blob, &self.pending, &self.buf[..full]);
        // Each attempt copies the bytes into its batch once (a batch built
        // outside and cloned for each attempt copied every chunk twice).
        engine
            .retrying(|| async {
                let mut b = Batch::new();
                if register {
                    b.put(pending.clone(), blob.as_bytes().to_vec(), 1);
                }
                for (n, piece) in (first..).zip(bytes.chunks(CHUNK)) {
                    b.put(schema::chunk_key(blob, n), piece.to_vec(), 1);
                }
                Ok(engine.store().write(b).await?)
            })
            .await?;
        self.next_chunk += full.div_ceil(CHUNK) as u64;
        self.buf.drain(..full);
        Ok(())
    }

    /// Stores the last bytes and points the item at the new body, if the
    /// item is still at `if_match` when given.
    pub async fn finish(mut self, if_match: Option<u64>) -> Result<ItemView> {
        let engine = self.engine.clone();
        {
            let slot = engine.upload_place().await?;
            let began = Instant::now();
            self.flush(true).await?;
            self.rest(began, true).await;
            drop(slot);
        }
        let (words, word_count) = body_words(self.text.take(), self.size, &self.content_type);
        let meta = BodyMeta {
            size: self.size,
            content_type: self.content_type.clone(),
            sha256: hex(&std::mem::take(&mut self.hasher).finalize()),
            blob: self.blob.clone(),
            chunk: CHUNK as u32,
            words,
            word_count,
        };
        let view = engine
            .retrying(|| async {
                let mut snap = engine.snapshot().await?;
                let (_, a, defs, _) = engine
                    .read_item_for(
                        &mut snap,
                        &self.caller,
                        ItemWant::write(&self.item_id, self.link.as_deref()),
                        &[],
                        &[],
                    )
                    .await?;
                drop(snap);
                let defs = defs.expect("asked for");
                engine.require_role(&a, Role::Editor, "uploading a body")?;
                check_version(&a.item, if_match)?;
                let mut after = a.item.clone();
                after.body = Some(meta.clone());
                after.version += 1;
                after.modified_at = engine.now().max(a.item.modified_at + 1);
                let mut b = Batch::new();
                if self.stored {
                    b.delete(self.pending.clone());
                }
                if let Some(old) = &a.item.body {
                    engine.bury_blob(&mut b, &old.blob);
                }
                engine.update_item(&mut b, &defs, &a, Some(&after));
                engine.write_changes(b).await?;
                Ok(ItemView {
                    item: after,
                    role: a.role,
                })
            })
            .await?;
        self.done = true;
        Ok(view)
    }
}

impl Drop for BodyUpload {
    fn drop(&mut self) {
        self.engine.count_upload(-1);
        if self.done || !self.stored {
            return;
        }
        // Unfinished (error, client gone): remove what was written now; the
        // graveyard entry stays for the sweeper if this fails.
        let engine = self.engine.clone();
        let blob = std::mem::take(&mut self.blob);
        let pending = self.pending.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let removed = async {
                    engine.retrying(|| engine.delete_blob(&blob)).await?;
                    let mut b = Batch::new();
                    b.delete(pending);
                    engine.store().write(b).await?;
                    Ok::<_, EngineError>(())
                };
                if let Err(e) = removed.await {
                    tracing::warn!(blob = %blob, error = %e, "an abandoned upload waits for the sweeper");
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
        let engine = &self.engine;
        let scan = Scan::partition(BLOBS, self.blob.as_bytes().to_vec(), CHUNKS_PER_IO).bounds(
            Bound::Included(first.to_be_bytes().to_vec()),
            Bound::Unbounded,
        );
        let rows = engine
            .retrying(|| async { Ok(engine.snapshot().await?.scan(&scan).await?) })
            .await?;
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

/// Refuses a body's `Content-Type` that is not a media type of at most
/// 255 bytes: `type/subtype`, each a token (RFC 9110, 8.3.1) and neither
/// a media range's `*`, parameters after a `;` as they come.
pub fn check_content_type(content_type: &str) -> Result<()> {
    if content_type.len() > 255 {
        return Err(EngineError::InvalidInput(
            "a body's Content-Type is at most 255 bytes".into(),
        ));
    }
    if !is_media_type(content_type) {
        return Err(EngineError::InvalidInput(
            "Content-Type is a media type, type/subtype (such as text/plain)".into(),
        ));
    }
    Ok(())
}

/// A content type's essence: its type/subtype, lower case, without
/// parameters.
pub fn media_essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Whether a content type's essence is a media type's form,
/// `type/subtype`, each a token (RFC 9110, 8.3.1) and not `*`.
fn is_media_type(content_type: &str) -> bool {
    let token = |t: &str| {
        !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    media_essence(content_type)
        .split_once('/')
        .is_some_and(|(t, sub)| token(t) && token(sub) && t != "*" && sub != "*")
}

/// A body's most used words and its indexed word count, from `text`, its
/// first bytes if it is textual (`None` if not), and its `size`.
pub(crate) fn body_words(
    text: Option<Vec<u8>>,
    size: u64,
    content_type: &str,
) -> (Vec<(String, u32)>, u32) {
    match text {
        Some(t) => crate::text::word_counts(
            &indexed_text(t, size, crate::search::BODY_TEXT, content_type),
            crate::search::BODY_WORDS,
        ),
        None => (Vec::new(), 0),
    }
}

/// A textual body of `size` bytes as its text index reads it, from `raw`,
/// its first bytes ([`crate::search::BODY_READ`]), decoded as its content
/// type says ([`Charset`]): all of it when it has at most `limit` bytes,
/// else its words that end within the first `limit` bytes (Unicode's word
/// bounds, so in any script; the bytes read past `limit` tell whether a
/// word ending there goes on), so that a word the limit splits is not
/// indexed as the fragment it left.
fn indexed_text(raw: Vec<u8>, size: u64, limit: usize, content_type: &str) -> String {
    use unicode_segmentation::UnicodeSegmentation;
    let charset = Charset::of(content_type);
    let mut text = charset.decode(&raw);
    if size > limit as u64 {
        // Where the limit's byte falls in the text.
        let limit = match charset {
            Charset::Utf8 => limit,
            _ => charset.decode(&raw[..limit.min(raw.len())]).len(),
        };
        let end = text
            .split_word_bound_indices()
            .rev()
            .map(|(i, w)| i + w.len())
            .find(|&end| end <= limit)
            .unwrap_or(0);
        text.truncate(end);
    }
    text
}

/// The character encodings a textual body is read in: the `charset` its
/// content type names, as browsers take the names (WHATWG Encoding:
/// `iso-8859-1` and `us-ascii` are windows-1252, `utf-16` without a byte
/// order mark is little-endian), else UTF-8, which JSON always is. Bytes
/// that are no text in it read as U+FFFD.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Charset {
    Utf8,
    Windows1252,
    Utf16 { big_endian: bool },
}

impl Charset {
    fn of(content_type: &str) -> Charset {
        let name = content_type.split(';').skip(1).find_map(|p| {
            let (k, v) = p.split_once('=')?;
            k.trim()
                .eq_ignore_ascii_case("charset")
                .then(|| v.trim().trim_matches('"').to_ascii_lowercase())
        });
        match name.as_deref() {
            Some(
                "iso-8859-1" | "iso8859-1" | "iso_8859-1" | "latin1" | "l1" | "us-ascii" | "ascii"
                | "windows-1252" | "cp1252" | "x-cp1252",
            ) => Charset::Windows1252,
            Some("utf-16" | "utf-16le") => Charset::Utf16 { big_endian: false },
            Some("utf-16be") => Charset::Utf16 { big_endian: true },
            _ => Charset::Utf8,
        }
    }

    fn decode(self, bytes: &[u8]) -> String {
        match self {
            Charset::Utf8 => String::from_utf8_lossy(bytes).into_owned(),
            Charset::Windows1252 => bytes.iter().map(|&b| windows_1252(b)).collect(),
            Charset::Utf16 { big_endian } => {
                let (big_endian, bytes) = match bytes {
                    [0xFE, 0xFF, rest @ ..] => (true, rest),
                    [0xFF, 0xFE, rest @ ..] => (false, rest),
                    _ => (big_endian, bytes),
                };
                let units = bytes.chunks_exact(2).map(|u| {
                    let pair = [u[0], u[1]];
                    if big_endian {
                        u16::from_be_bytes(pair)
                    } else {
                        u16::from_le_bytes(pair)
                    }
                });
                char::decode_utf16(units)
                    .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
                    .collect()
            }
        }
    }
}

/// A byte of windows-1252: ISO-8859-1 but for 0x80–0x9F, which hold
/// punctuation (`’`, `“`, `–`, `…`) and a few letters (`Š`, `Œ`, `ž`).
fn windows_1252(b: u8) -> char {
    const HIGH: [char; 32] = [
        '€', '\u{81}', '‚', 'ƒ', '„', '…', '†', '‡', 'ˆ', '‰', 'Š', '‹', 'Œ', '\u{8D}', 'Ž',
        '\u{8F}', '\u{90}', '‘', '’', '“', '”', '•', '–', '—', '˜', '™', 'š', '›', 'œ', '\u{9D}',
        'ž', 'Ÿ',
    ];
    match b {
        0x80..=0x9F => HIGH[usize::from(b - 0x80)],
        b => char::from(b),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cut_body_is_indexed_up_to_its_last_whole_word() {
        let cut = |text: &str, size: usize, limit| {
            super::indexed_text(text.into(), size as u64, limit, "text/plain")
        };
        // The whole body read: words ending within the limit are kept, a
        // word ending at its last byte too.
        let text = "plum cot plumcot";
        assert_eq!(cut(text, text.len(), 16), text);
        assert_eq!(cut(text, text.len(), 15), "plum cot ");
        assert_eq!(cut(text, text.len(), 8), "plum cot");
        assert_eq!(cut(text, text.len(), 7), "plum ");
        // Part of a longer body: the bytes past the limit decide.
        assert_eq!(cut("plum cot plumcot", 100, 8), "plum cot");
        assert_eq!(cut("plum cotton", 100, 8), "plum ");
        assert_eq!(cut("plumcotxyz", 100, 8), "");
        // Words without spaces between them lose only the last one.
        let cjk = "日本語のテキスト";
        let kept = cut(cjk, 100, cjk.len() - 1);
        assert!(!kept.is_empty() && cjk.starts_with(&kept), "{kept}");
    }

    #[test]
    fn a_body_is_read_in_the_charset_its_type_names() {
        let read = |bytes: &[u8], content_type| {
            super::indexed_text(bytes.to_vec(), bytes.len() as u64, 100, content_type)
        };
        assert_eq!(read(b"caf\xe9", "text/plain; charset=ISO-8859-1"), "café");
        assert_eq!(
            read(
                b"caf\xe9 \x93l\x92eau\x94",
                "text/plain;charset=\"windows-1252\""
            ),
            "café “l’eau”"
        );
        assert_eq!(read(b"caf\xe9", "text/plain"), "caf\u{FFFD}");
        assert_eq!(read("café".as_bytes(), "application/json"), "café");
        let le: Vec<u8> = [0xFF, 0xFE]
            .into_iter()
            .chain("hé 日".encode_utf16().flat_map(u16::to_le_bytes))
            .collect();
        assert_eq!(read(&le, "text/plain; charset=utf-16"), "hé 日");
        let be: Vec<u8> = "hé".encode_utf16().flat_map(u16::to_be_bytes).collect();
        assert_eq!(read(&be, "text/plain; charset=UTF-16BE"), "hé");
        // The limit counts the body's bytes, whatever the charset: two a
        // letter here, after the byte order mark.
        let cut = super::indexed_text(le.clone(), 100, 8, "text/plain; charset=utf-16");
        assert_eq!(cut, "hé ");
    }
}

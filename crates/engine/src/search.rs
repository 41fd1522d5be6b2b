//! Full-text search on the same store, in the same transactions, with the
//! same access model as listings.
//!
//! A text index holds, for every term of an item and every principal that
//! may read it (but only `everyone`'s, or `authenticated`'s, for an item
//! shared with it, in indexes declared since 2026-12-01:
//! [`Readers`](crate::indexes::Readers)),
//! one row:
//!
//! ```text
//! partition  = (index uid, principal, [bucket], where-values..., first two characters of the term)
//! clustering = (term, impact descending, item id)
//! ```
//!
//! where a term's head is its first two characters (a Hangul term's, its
//! first syllable, in indexes declared since 2026-12-01: [`Heads`]), and
//! one *forward* row per item with the impact of each of its terms.
//! The *impact* of a term is its weight in that one item (term frequency
//! in each field, saturated and normalised by the field's length against
//! a fixed length, times the field's weight): it depends on the item alone,
//! so nothing about items a caller cannot read moves what the caller sees,
//! scores included. There are no global statistics.
//!
//! A query reads, for each of its words and each of the caller's
//! partitions, the term's rows in impact order (one ordered, limited read
//! per word and principal, merged in code), and runs Fagin's threshold
//! algorithm: candidates are checked against their forward rows, and
//! reading stops once no unread row can lift an item into the page.
//! Forward rows wait until any word has given at least [`DEFER_LOOKUPS`]
//! rows or has ended, and a candidate that could not reach the page whatever it lacks
//! is never checked (on lists of common words a random read per candidate
//! was most of a search's time). A
//! prefix (search-as-you-type) is expanded to the terms that start with it
//! by a few bounded reads of the caller's own partitions of its first two
//! characters (of one character: [`prefix_heads`], some fifty to 110), each
//! skipping past the rows of the last term it saw — never a scan across
//! partitions. A word typed past its stem ("brewi", on its
//! way to "brewing", whose term is "brew") also matches the stems of the
//! words that complete it ([`Analyzer::stems_typed_past`], English
//! endings): exact reads of the same partitions, at most a handful.
//!
//! Bounds: a query has at most [`MAX_WORDS`] words and [`MAX_QUERY`] bytes;
//! a prefix expands to at most [`MAX_EXPANSION`] terms; one search looks at
//! no more than [`SCAN_BUDGET`] index rows per word (past it, the page is
//! the best of what was looked at); a later page of a one-word, one-term
//! search starts its reads at its cursor, so its budget counts from there. Writes: an item has at most
//! [`MAX_TERMS`] terms per text index, so it writes at most
//! `MAX_TERMS × readers + 1` rows per text index.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tarn_store::{Direction, Key, Row, Scan, Snapshot, SnapshotExt, Table};
use unicode_properties::{GeneralCategoryGroup, UnicodeGeneralCategory};

use crate::actor::Resolve;
use crate::error::{EngineError, Result};
use crate::indexes::{bucket_of, is_shared, Heads, IndexDef, IndexState};
use crate::keys::{decode_str, encode_str, encoded_prefix, successor};
use crate::listing::{Merge, Step};
use crate::schema::{self, ItemRow, INDEX};
use crate::text::{words, Analyzer};
use crate::{seal, unseal, Caller, Engine, Item, ItemView, Principal, Role};

/// The forward rows: every term of an item with its impact.
pub(crate) const FORWARD: Table = Table::new("txt_fwd");
/// Most terms an item has in one text index: the weightiest are kept.
pub const MAX_TERMS: usize = 512;
/// Most distinct words in a query.
pub const MAX_WORDS: usize = 16;
/// Most bytes in a query.
pub const MAX_QUERY: usize = 1024;
/// Most terms a prefix expands to.
pub const MAX_EXPANSION: usize = 32;
/// Rows a prefix's expansion reads per partition in its first round (most
/// prefixes are expanded in one), and in each later round.
const EXPAND_FIRST: usize = 32;
const EXPAND_ROWS: usize = 8;
/// Most partitions a one-character prefix's expansion reads (its heads,
/// some fifty for Latin, Cyrillic and Greek, up to about 110 for Katakana
/// and the Indic scripts, times the caller's partitions): about four
/// times what a listing by a caller in the most groups reads. Past it
/// the prefix matches the whole word only.
const EXPAND_PARTITIONS: usize = 4096;
/// Rounds of a prefix's expansion: each finds at least one term more in
/// every partition it reads, so as many as the terms a prefix keeps.
const EXPAND_ROUNDS: usize = MAX_EXPANSION;
/// Most index rows one search reads per word.
pub const SCAN_BUDGET: usize = 20_000;
/// Forward rows are read once any word has given at least this many rows
/// in order (or has ended): until then, reading on costs less than a
/// random read per candidate, and may end a word (with `match=all`,
/// settling every candidate).
const DEFER_LOOKUPS: usize = 256;
/// Words a body keeps for indexing: its most used.
pub(crate) const BODY_WORDS: usize = 512;
/// Bytes of a textual body that are indexed.
pub(crate) const BODY_TEXT: usize = 1024 * 1024;
/// Bytes of a textual body that are read for indexing: [`BODY_TEXT`] and
/// a few more, which show whether a word ending at its last byte goes on.
pub(crate) const BODY_READ: usize = BODY_TEXT + 32;

const K1: f64 = 1.2;
const B: f64 = 0.75;
/// The field length impacts are normalised against: a constant, not an
/// average over items (which would let other items move scores).
const LENGTH: f64 = 32.0;
/// In `match=any`, each word matched counts this much more than any sum
/// of impacts (at most [`MAX_WORDS`] of the largest impact), so items
/// matching more words come first.
const MATCHED: u64 = 1 << 26;
/// An impact is kept in two bytes (in a row's clustering key and in the
/// forward row), coded as its text index says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Impacts {
    /// Thousandths, saturating at 65.535, so fields of weight 30 or more
    /// tie: text indexes declared before 2026-11-26 (their rows hold these
    /// codes, and are found and removed by them).
    #[default]
    Milli,
    /// Thousandths below [`FINE`], steps of [`COARSE`] thousandths above,
    /// so that even eight fields of weight 100 (2,200 × 8 at most) rank by
    /// their words.
    Stepped,
}

const FINE: u32 = 1 << 15;
const COARSE: u32 = 64;

impl Impacts {
    /// Whether this is the code of older declarations.
    pub fn is_milli(&self) -> bool {
        *self == Impacts::Milli
    }

    /// The two-byte code of an impact in thousandths: monotone, and the
    /// inverse of [`Impacts::milli`] on every code.
    fn code(self, milli: u32) -> u16 {
        let milli = milli.max(1);
        match self {
            Impacts::Milli => milli.min(u32::from(u16::MAX)) as u16,
            Impacts::Stepped if milli < FINE => milli as u16,
            Impacts::Stepped => {
                (FINE + (milli - FINE).div_ceil(COARSE)).min(u32::from(u16::MAX)) as u16
            }
        }
    }

    /// The impact, in thousandths, a code stands for.
    fn milli(self, code: u16) -> u32 {
        let c = u32::from(code);
        match self {
            Impacts::Stepped if c >= FINE => FINE + (c - FINE) * COARSE,
            _ => c,
        }
    }
}

/// A search request.
#[derive(Clone, Debug)]
pub struct SearchQuery {
    /// The words.
    pub q: String,
    /// The kind; `None` searches every text index without where-fields.
    pub kind: Option<String>,
    /// Equality on the index's where-fields.
    pub where_: Vec<(String, Value)>,
    /// Every word must occur (`match=all`), or at least one (`any`).
    pub all: bool,
    /// The last word also matches terms that start with it.
    pub prefix: bool,
    /// Page size.
    pub limit: usize,
    /// Where the previous page ended.
    pub cursor: Option<String>,
}

impl Default for SearchQuery {
    fn default() -> Self {
        SearchQuery {
            q: String::new(),
            kind: None,
            where_: Vec::new(),
            all: true,
            prefix: false,
            limit: 50,
            cursor: None,
        }
    }
}

/// One hit.
#[derive(Clone, Debug)]
pub struct Hit {
    /// The item as the caller reads it.
    pub item: ItemView,
    /// Its score: the sum of its matched words' impacts; with `match=any`,
    /// more by [`MATCHED`] (in thousandths) for each word matched past the
    /// first ([`shown_score`]).
    pub score: f64,
}

/// A page of hits, best first.
#[derive(Clone, Debug)]
pub struct SearchPage {
    /// The hits.
    pub hits: Vec<Hit>,
    /// The cursor of the next page.
    pub next: Option<String>,
}

/// Whether a content type is text a `$body` field indexes: `text/*`,
/// `application/json` and `application/xml`, as api.md names them (an
/// `image/svg+xml` or another `+xml` or `+json` type is not).
pub fn is_textual(content_type: &str) -> bool {
    let essence = crate::bodies::media_essence(content_type);
    essence.starts_with("text/") || essence == "application/json" || essence == "application/xml"
}

/// The head of a term, which names the partition its rows live in: its
/// first two characters, or as `heads` says.
fn head(heads: Heads, term: &str) -> &str {
    let mut chars = term.char_indices();
    let syllable = matches!(chars.next(), Some((_, '\u{AC00}'..='\u{D7A3}')));
    let n = if syllable && heads == Heads::Syllable {
        1
    } else {
        2
    };
    match term.char_indices().nth(n) {
        Some((i, _)) => &term[..i],
        None => term,
    }
}

fn term_partition(
    def: &IndexDef,
    principal: &Principal,
    bucket: u32,
    where_values: &[Option<&Value>],
    term: &str,
) -> Vec<u8> {
    let mut p = def.partition(principal, bucket, where_values);
    encode_str(&mut p, head(def.heads, term));
    p
}

fn forward_key(def: &IndexDef, id: &str) -> Key {
    let mut p = Vec::with_capacity(48);
    encode_str(&mut p, &def.uid);
    encode_str(&mut p, id);
    Key::new(FORWARD, p, b"f".to_vec())
}

fn encode_forward(impacts: &BTreeMap<String, u16>) -> Vec<u8> {
    let mut out = Vec::with_capacity(impacts.len() * 10);
    for (t, i) in impacts {
        out.push(t.len() as u8);
        out.extend_from_slice(t.as_bytes());
        out.extend_from_slice(&i.to_be_bytes());
    }
    out
}

/// The best impact of each slot's terms in a forward row (`None` where
/// the item has none of them), in one pass over the row: nothing else of
/// it is decoded (a hash map of every term per candidate was most of a
/// search's instructions).
fn slot_impacts(bytes: &[u8], slots: &[Slot], codes: Impacts) -> Result<Vec<Option<u32>>> {
    let bad = || crate::error::corrupt("forward row", "truncated");
    let mut out = vec![None; slots.len()];
    let mut left_out = vec![false; slots.len()];
    let mut i = 0;
    while i < bytes.len() {
        let n = bytes[i] as usize;
        let t = bytes.get(i + 1..i + 1 + n).ok_or_else(bad)?;
        let imp = bytes.get(i + 1 + n..i + 3 + n).ok_or_else(bad)?;
        let imp = codes.milli(u16::from_be_bytes([imp[0], imp[1]]));
        for ((best, other), s) in out.iter_mut().zip(&mut left_out).zip(slots) {
            if s.terms.iter().any(|q| q.as_bytes() == t) {
                if best.is_none_or(|b| b < imp) {
                    *best = Some(imp);
                }
            } else if s
                .unexpanded
                .as_ref()
                .is_some_and(|p| t.starts_with(p.as_bytes()))
            {
                *other = true;
            }
        }
        i += 3 + n;
    }
    for (best, other) in out.iter_mut().zip(left_out) {
        if best.is_none() && other {
            *best = Some(LEFT_OUT);
        }
    }
    Ok(out)
}

/// The strings of a property value: a string, or the strings of an array.
fn strings(v: &Value) -> Vec<&str> {
    match v {
        Value::String(s) => vec![s.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// Every term of an item in a text index with its impact, the weightiest
/// [`MAX_TERMS`].
pub(crate) fn impacts(def: &IndexDef, item: &Item) -> BTreeMap<String, u16> {
    let analyzer = Analyzer::new(def.language.as_deref().unwrap_or("english"));
    let mut acc: HashMap<String, f64> = HashMap::new();
    for field in &def.text {
        let mut tf: HashMap<String, u32> = HashMap::new();
        let mut len = 0u32;
        if field.field == "$body" {
            if let Some(body) = &item.body {
                for (w, n) in &body.words {
                    *tf.entry(analyzer.term(w)).or_insert(0) += n;
                }
                len = body.word_count;
            }
        } else if let Some(v) = item.field(&field.field) {
            for s in strings(&v) {
                for w in words(s) {
                    len += 1;
                    *tf.entry(analyzer.term(&w)).or_insert(0) += 1;
                }
            }
        }
        let norm = K1 * (1.0 - B + B * f64::from(len.max(1)) / LENGTH);
        for (term, n) in tf {
            let n = f64::from(n);
            *acc.entry(term).or_insert(0.0) += field.weight * n * (K1 + 1.0) / (n + norm);
        }
    }
    let mut terms: Vec<(String, u16)> = acc
        .into_iter()
        .map(|(t, s)| {
            let milli = (s * 1000.0).round().clamp(1.0, f64::from(u32::MAX)) as u32;
            (t, def.impacts.code(milli))
        })
        .collect();
    if terms.len() > MAX_TERMS {
        terms.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        terms.truncate(MAX_TERMS);
    }
    terms.into_iter().collect()
}

/// Every row of a text index for an item: one per term and reader, and the
/// forward row.
pub(crate) fn text_rows(def: &IndexDef, item: &Item, split: u32) -> Vec<(Key, Vec<u8>)> {
    let impacts = impacts(def, item);
    if impacts.is_empty() {
        return Vec::new();
    }
    let values = def.where_values(item);
    let refs: Vec<Option<&Value>> = values.iter().map(|v| v.as_ref()).collect();
    let bucket = bucket_of(&item.id, split);
    let readers = def.readers.of(item);
    let mut out = Vec::with_capacity(impacts.len() * readers.len() + 1);
    for (term, impact) in &impacts {
        let mut clustering = Vec::with_capacity(term.len() + item.id.len() + 8);
        encode_str(&mut clustering, term);
        clustering.extend_from_slice(&(!impact).to_be_bytes());
        encode_str(&mut clustering, &item.id);
        for p in &readers {
            let part = term_partition(def, p, bucket, &refs, term);
            out.push((
                Key::new(INDEX, part, clustering.clone()),
                item.id.as_bytes().to_vec(),
            ));
        }
    }
    out.push((forward_key(def, &item.id), encode_forward(&impacts)));
    out
}

/// A hit's place in the order: score descending, then id.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Place {
    score: u64,
    id: String,
}

impl PartialOrd for Place {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Place {
    /// Better places are smaller.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other
            .score
            .cmp(&self.score)
            .then_with(|| self.id.cmp(&other.id))
    }
}

const CURSOR_VERSION: u8 = 3;

/// What a cursor is sealed for: the search's words, kind, where values,
/// match mode and prefix, so that a cursor of one search is refused by
/// another instead of starting it at a foreign place.
fn search_route(q: &SearchQuery, fields: &BTreeMap<String, Value>) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(64);
    let mut put = |b: &[u8]| {
        bytes.extend_from_slice(&(b.len() as u32).to_be_bytes());
        bytes.extend_from_slice(b);
    };
    put(q.q.as_bytes());
    put(q.kind.as_deref().unwrap_or("").as_bytes());
    for (f, v) in fields {
        put(f.as_bytes());
        put(&crate::keys::encoded_where(Some(v)));
    }
    put(&[
        u8::from(q.kind.is_some()),
        u8::from(q.all),
        u8::from(q.prefix),
    ]);
    let mut route = b"search:".to_vec();
    route.extend_from_slice(&crate::sha256(&bytes)[..16]);
    route
}

fn encode_cursor(key: &[u8], route: &[u8], p: &Place) -> String {
    let mut c = vec![CURSOR_VERSION];
    c.extend_from_slice(&p.score.to_be_bytes());
    c.extend_from_slice(p.id.as_bytes());
    seal(key, route, &c)
}

fn decode_cursor(key: &[u8], route: &[u8], c: &str) -> Result<Place> {
    let bad = || EngineError::InvalidInput("the cursor does not belong to this search".into());
    if c.len() > 200 {
        return Err(bad());
    }
    let raw = unseal(key, route, c).ok_or_else(bad)?;
    if raw.len() < 10 || raw[0] != CURSOR_VERSION {
        return Err(bad());
    }
    let score = u64::from_be_bytes(raw[1..9].try_into().expect("8 bytes"));
    let id = String::from_utf8(raw[9..].to_vec()).map_err(|_| bad())?;
    Ok(Place { score, id })
}

/// The impact, in thousandths, of a prefix in an item that holds only
/// terms it starts but left out of its expansion: the least there is, so
/// such an item ranks below one holding a term expanded to that scores
/// alike in the other words, its score is the same whichever word's rows
/// found it, and no row read of the prefix (at least 1) bounds it too low.
const LEFT_OUT: u32 = 1;

/// One word of a query: the terms it matches (several for a prefix), and
/// the merge of their rows over the caller's partitions.
struct Slot {
    terms: Vec<String>,
    merge: Merge,
    /// The impact of the last row taken: no unread row has a higher one.
    last: u32,
    /// No more rows are read (all taken, or the scan budget spent).
    done: bool,
    /// Every row has been taken.
    complete: bool,
    read: usize,
    /// A prefix whose expansion left terms out ([`MAX_EXPANSION`]): its
    /// rows are not all of the word's, so an item not seen here may still
    /// hold it, which its forward row tells (a term starting with it,
    /// counted at [`LEFT_OUT`]).
    unexpanded: Option<String>,
}

impl Slot {
    /// Every row has been taken, and they are all of the word's: an item
    /// not seen here lacks the word.
    fn absent(&self) -> bool {
        self.complete && self.unexpanded.is_none()
    }
}

/// What a prefix expands to.
struct Expansion {
    prefix: String,
    terms: Vec<String>,
    /// For each partition read to its end, every term it has that starts
    /// with the prefix.
    listed: HashMap<Vec<u8>, HashSet<String>>,
    /// Every term starting with the prefix is in `terms`.
    whole: bool,
}

impl Expansion {
    /// Whether `partition` surely has no row of `term`: a search reads
    /// only the partitions that hold the terms a prefix expanded to.
    fn lacks(&self, partition: &[u8], term: &str) -> bool {
        term.starts_with(&self.prefix)
            && self
                .listed
                .get(partition)
                .is_some_and(|l| !l.contains(term))
    }
}

/// The partition heads (first two characters of a term) that can hold
/// the terms starting with `prefix`: its own when it has two characters
/// or more. For one character: the character alone, and followed by each
/// digit, by each character that may join the inside of a word (Unicode
/// word segmentation keeps `o'brien`, `l’eau`, `1,000`, `3.14`, `l·l`
/// whole; folding spells every apostrophe `'`), and by each lower-case
/// letter, after folding, of the scripts the first character is one of:
/// Latin (with the letters that fold to no ASCII one, such as `ŋ`, `ə`),
/// Cyrillic, Greek, Arabic, Hebrew, Armenian, Georgian, Katakana, the
/// Indic scripts (each letter and mark of its block that folding keeps).
/// A first character of another script has no second
/// characters listed: its prefix matches the whole word only, as do the
/// terms whose second character is none of those listed (until two
/// characters are typed) — but for a Hangul syllable, whose partition
/// holds every term it starts under [`Heads::Syllable`].
fn prefix_heads(prefix: &str) -> Vec<String> {
    let mut chars = prefix.chars();
    let (Some(first), None) = (chars.next(), chars.next()) else {
        return vec![prefix.to_string()];
    };
    const JOINERS: [char; 7] = ['\'', '.', ',', ':', ';', '·', '_'];
    let letters: Vec<char> = match first {
        // Cyrillic: `й` folds to `и`, `ё` to `е`, `ї` to `і`.
        '\u{0400}'..='\u{04FF}' => ('а'..='и')
            .chain('к'..='я')
            .chain([
                'і', 'є', 'ґ', 'ј', 'љ', 'њ', 'ђ', 'ћ', 'џ', 'ѕ', 'ә', 'ө', 'ү', 'қ', 'ң', 'ғ',
                'ұ', 'һ', 'ҳ', 'ҷ', 'ӣ', 'ӯ',
            ])
            .collect(),
        // Greek: accents fold away, and a final `ς` is `σ`.
        '\u{0370}'..='\u{03FF}' => ('α'..='ρ').chain('σ'..='ω').collect(),
        // Arabic: its letters (a hamza or madda over a letter folds away,
        // as the vowel points do) and those Persian and Urdu add.
        '\u{0600}'..='\u{06FF}' => ('\u{0621}'..='\u{064A}')
            .chain([
                '\u{0679}', '\u{067E}', '\u{0686}', '\u{0688}', '\u{0691}', '\u{0698}', '\u{06A9}',
                '\u{06AF}', '\u{06BA}', '\u{06BE}', '\u{06C1}', '\u{06CC}', '\u{06D2}',
            ])
            .collect(),
        // Hebrew: the letters, final forms among them (points fold away),
        // and the geresh and gershayim that words keep inside them.
        '\u{0590}'..='\u{05FF}' => ('\u{05D0}'..='\u{05EA}')
            .chain(['\u{05F3}', '\u{05F4}'])
            .collect(),
        // Armenian, lower case.
        '\u{0530}'..='\u{058F}' => ('\u{0561}'..='\u{0587}').collect(),
        // Georgian.
        '\u{10A0}'..='\u{10FF}' => ('\u{10D0}'..='\u{10FA}').collect(),
        // Katakana and its long vowel mark: a run of it is one word to
        // segmentation (a hiragana or an ideograph is a word alone).
        '\u{30A0}'..='\u{30FF}' => ('\u{30A1}'..='\u{30FA}').chain(['\u{30FC}']).collect(),
        // The Indic scripts, Devanagari to Malayalam and Sinhala: every
        // letter and mark of the script's block of 128 that folding
        // leaves as it is (a Devanagari `क़` folds to `क` and the nukta).
        c @ '\u{0900}'..='\u{0DFF}' => {
            let base = c as u32 & !0x7F;
            (base..base + 0x80)
                .filter_map(char::from_u32)
                .filter(|c| {
                    matches!(
                        c.general_category_group(),
                        GeneralCategoryGroup::Letter | GeneralCategoryGroup::Mark
                    ) && crate::text::fold(c.encode_utf8(&mut [0; 4]))
                        .chars()
                        .eq([*c])
                })
                .collect()
        }
        c if c.is_ascii_alphanumeric()
            || matches!(c, '\u{00C0}'..='\u{024F}' | '\u{0250}'..='\u{02AF}') =>
        {
            ('a'..='z').chain(['ŋ', 'ə', 'ɛ', 'ɔ', 'ʒ', 'ĸ']).collect()
        }
        _ => return vec![prefix.to_string()],
    };
    std::iter::once(prefix.to_string())
        .chain(
            letters
                .into_iter()
                .chain('0'..='9')
                .chain(JOINERS)
                .map(|c| format!("{first}{c}")),
        )
        .collect()
}

/// The score a hit shows, in impact units: its sum of impacts, and with
/// `match=any` [`MATCHED`] more for each word matched past the first, so
/// that scores fall down the page as the hits do (an item matching more
/// words comes first whatever its impacts), and a one-word match scores
/// the same in both modes.
fn shown_score(score: u64, all: bool) -> f64 {
    let score = if all {
        score
    } else {
        score.saturating_sub(MATCHED)
    };
    score as f64 / 1000.0
}

/// The most an item could score given the impacts known of it: a word
/// not read to its end may still hold it at the impact of the word's last
/// row read.
fn upper_bound(known: &[Option<u32>], slots: &[Slot], all: bool) -> u64 {
    let mut sum = 0u64;
    let mut matched = 0u64;
    for (k, s) in known.iter().zip(slots) {
        let most = match k {
            Some(i) => Some(*i),
            None if s.absent() => None,
            None => Some(s.last),
        };
        if let Some(i) = most {
            sum += u64::from(i);
            matched += 1;
        }
    }
    if all {
        sum
    } else {
        matched * MATCHED + sum
    }
}

/// The (impact, id) of a term row, past its term.
fn parse_row(row: &Row, strip: usize, codes: Impacts) -> Option<(u32, String)> {
    let rest = row.clustering.get(strip..)?;
    let impact = codes.milli(!u16::from_be_bytes([*rest.first()?, *rest.get(1)?]));
    let (id, _) = decode_str(&rest[2..])?;
    Some((impact, id))
}

impl Engine {
    /// One page of the items the caller may read whose text matches the
    /// query, best first.
    pub async fn search(&self, caller: &Caller, q: &SearchQuery) -> Result<SearchPage> {
        if q.q.trim().is_empty() {
            return Err(EngineError::InvalidInput(
                "q names the words to find".into(),
            ));
        }
        if q.q.len() > MAX_QUERY {
            return Err(EngineError::InvalidInput(format!(
                "q has at most {MAX_QUERY} bytes"
            )));
        }
        crate::listing::check_limit(q.limit)?;
        if let Some(k) = &q.kind {
            crate::model::check_name("kind", k)?;
        }
        let fields = crate::listing::where_fields(&q.where_)?;
        let distinct: HashSet<String> = words(&q.q).collect();
        if distinct.len() > MAX_WORDS {
            return Err(EngineError::InvalidInput(format!(
                "q has at most {MAX_WORDS} different words"
            )));
        }
        let key = self.cursor_key().await?;
        let route = search_route(q, &fields);
        let cursor = q
            .cursor
            .as_deref()
            .map(|c| decode_cursor(key, &route, c))
            .transpose()?;
        let sealing = (key, route.as_slice());
        self.retrying(|| self.search_once(caller, q, &fields, cursor.as_ref(), sealing))
            .await
    }

    async fn search_once(
        &self,
        caller: &Caller,
        q: &SearchQuery,
        fields: &BTreeMap<String, Value>,
        cursor: Option<&Place>,
        (key, route): (&[u8], &[u8]),
    ) -> Result<SearchPage> {
        let mut snap = self.snapshot().await?;
        let mut res = Resolve::new(caller)?;
        let mut gets = res.first_gets();
        let first = gets.len();
        gets.push(schema::defs_version_key());
        let out = crate::read(&mut snap, &gets, &res.scans()).await?;
        res.absorb_first(self, &out.rows[..first])?;
        res.absorb_scans(&out.scans)?;
        let defs = self.defs_at(&mut snap, &out.rows[first]).await?;
        let indexes = choose(&defs.defs, q.kind.as_deref(), fields)?;
        let actor = self.walk_to_end(&mut snap, res).await?;
        let want = q.limit + 1;
        let mut best: BTreeMap<Place, ()> = BTreeMap::new();
        let mut seen_ids: HashSet<String> = HashSet::new();
        for def in &indexes {
            let values: Vec<Value> = def.where_.iter().map(|f| fields[f].clone()).collect();
            let found = self
                .threshold(&mut snap, def, &actor.principals, q, &values, cursor, want)
                .await?;
            for p in found {
                if seen_ids.insert(p.id.clone()) {
                    best.insert(p, ());
                }
            }
            while best.len() > want {
                best.pop_last();
            }
        }
        let places: Vec<Place> = best.into_keys().collect();
        let more = places.len() > q.limit;
        let page = &places[..places.len().min(q.limit)];
        let keys: Vec<Key> = page.iter().map(|p| schema::item_key(&p.id)).collect();
        let rows = snap.get_many(&keys).await?;
        drop(snap);
        let mut hits = Vec::with_capacity(page.len());
        for (p, row) in page.iter().zip(rows) {
            let Some(row) = row else { continue };
            let stored = ItemRow::decode(&row)?;
            let role = if actor.admin {
                Some(Role::Manager)
            } else {
                stored.item.role_of(&actor.principals)
            };
            if let Some(role) = role {
                hits.push(Hit {
                    item: ItemView {
                        item: stored.item,
                        role,
                    },
                    score: shown_score(p.score, q.all),
                });
            }
        }
        Ok(SearchPage {
            hits,
            next: if more {
                page.last().map(|p| encode_cursor(key, route, p))
            } else {
                None
            },
        })
    }

    /// The best `want` places after `cursor` in one text index, by the
    /// threshold algorithm.
    #[allow(clippy::too_many_arguments)]
    async fn threshold(
        &self,
        snap: &mut Box<dyn Snapshot>,
        def: &IndexDef,
        principals: &[Principal],
        q: &SearchQuery,
        where_values: &[Value],
        cursor: Option<&Place>,
        want: usize,
    ) -> Result<Vec<Place>> {
        let analyzer = Analyzer::new(def.language.as_deref().unwrap_or("english"));
        let mut query_words: Vec<String> = Vec::new();
        for w in words(&q.q) {
            if !query_words.contains(&w) {
                query_words.push(w);
            }
        }
        if query_words.is_empty() {
            return Ok(Vec::new());
        }
        let values: Vec<Option<&Value>> = where_values.iter().map(Some).collect();
        let split = self.split();
        let partitions = |term: &str| -> Vec<Vec<u8>> {
            principals
                .iter()
                .flat_map(|p| {
                    let buckets = if is_shared(p) { split } else { 1 };
                    (0..buckets).map(move |b| (p, b))
                })
                .map(|(p, b)| term_partition(def, p, b, &values, term))
                .collect()
        };
        // The terms of each word; the last one expanded when prefix.
        let mut slot_terms: Vec<(Vec<String>, Option<Expansion>)> = Vec::new();
        for (i, w) in query_words.iter().enumerate() {
            let mut terms = vec![analyzer.term(w)];
            let mut expansion = None;
            let heads = if q.prefix && i + 1 == query_words.len() {
                prefix_heads(w)
            } else {
                Vec::new()
            };
            let wide = match heads.len() {
                0 | 1 => 0,
                n => n * partitions(w).len(),
            };
            if !heads.is_empty() && wide <= EXPAND_PARTITIONS {
                let parts: Vec<Vec<u8>> = heads.iter().flat_map(|h| partitions(h)).collect();
                let e = self.expand(snap, &parts, heads.len(), w).await?;
                terms.extend(e.terms.iter().cloned());
                terms.extend(analyzer.stems_typed_past(w));
                expansion = Some(e);
            }
            let mut unique = Vec::new();
            for t in terms {
                if !unique.contains(&t) {
                    unique.push(t);
                }
            }
            if !slot_terms.iter().any(|(t, _)| *t == unique) {
                slot_terms.push((unique, expansion));
            }
        }
        // With one word of one term, an item's score is its impact there:
        // a later page starts its reads at the cursor's place instead of
        // reading again the rows of every page before it.
        let seek: Option<(u16, &str)> = match (cursor, slot_terms.as_slice()) {
            (Some(c), [(terms, _)]) if terms.len() == 1 => {
                let impact = if q.all {
                    Some(c.score)
                } else {
                    c.score.checked_sub(MATCHED)
                };
                impact
                    .and_then(|i| u32::try_from(i).ok())
                    .map(|i| (def.impacts.code(i), c.id.as_str()))
            }
            _ => None,
        };
        let mut batch = want;
        let mut slots: Vec<Slot> = slot_terms
            .into_iter()
            .map(|(terms, expansion)| {
                let mut merge = Merge::new(INDEX, Direction::Forward, None, batch);
                let mut ranges = Vec::new();
                for t in &terms {
                    let mut exact = Vec::new();
                    encode_str(&mut exact, t);
                    let upper = successor(&exact).map_or(Bound::Unbounded, Bound::Excluded);
                    // A row's clustering: the term, the impact inverted,
                    // the item id.
                    let lower = match seek {
                        Some((impact, id)) => {
                            let mut from = exact.clone();
                            from.extend_from_slice(&(!impact).to_be_bytes());
                            encode_str(&mut from, id);
                            from
                        }
                        None => exact.clone(),
                    };
                    for p in partitions(t) {
                        if expansion.as_ref().is_some_and(|e| e.lacks(&p, t)) {
                            continue;
                        }
                        ranges.push((
                            p,
                            Bound::Included(lower.clone()),
                            upper.clone(),
                            exact.len(),
                        ));
                    }
                }
                // Rows spread over the caller's partitions: each first
                // read takes twice its share of the batch, and a partition
                // that runs dry before the merge has its batch is read on.
                let first = (2 * batch / ranges.len().max(1)).max(4).min(batch);
                merge.add_ranges_reading(ranges, first);
                Slot {
                    terms,
                    merge,
                    last: u32::MAX,
                    done: false,
                    complete: false,
                    read: 0,
                    unexpanded: expansion.filter(|e| !e.whole).map(|e| e.prefix),
                }
            })
            .collect();
        let mut best: BTreeMap<Place, ()> = BTreeMap::new();
        let n_slots = slots.len();
        let mut seen: HashMap<String, Vec<Option<u32>>> = HashMap::new();
        // Candidates seen but not yet scored.
        let mut partial: Vec<String> = Vec::new();
        loop {
            // Sorted access: the next rows of every word, in one read per
            // round (more if merges need refills).
            for s in slots.iter_mut().filter(|s| !s.done) {
                s.merge.want_more(batch);
            }
            let mut first = true;
            loop {
                let mut scans = Vec::new();
                let mut owners = Vec::new();
                for (i, s) in slots.iter_mut().enumerate().filter(|(_, s)| !s.done) {
                    let more = if first {
                        s.merge.first_reads()
                    } else {
                        Vec::new()
                    };
                    let more = if more.is_empty() {
                        match s.merge.step() {
                            Step::Read(r) => r,
                            Step::Done => Vec::new(),
                        }
                    } else {
                        more
                    };
                    owners.push((i, more.len()));
                    scans.extend(more);
                }
                first = false;
                if scans.is_empty() {
                    break;
                }
                let mut out = crate::read(snap, &[], &scans).await?.scans.into_iter();
                for (i, n) in owners {
                    let answers: Vec<Vec<Row>> = out.by_ref().take(n).collect();
                    if n > 0 {
                        slots[i].merge.absorb(answers);
                    }
                }
            }
            // The rows just read, word by word in impact order: an item's
            // first row in a word carries its best impact there.
            let mut fresh: Vec<String> = Vec::new();
            for (i, s) in slots.iter_mut().enumerate().filter(|(_, s)| !s.done) {
                let rows = s.merge.drain();
                s.read += rows.len();
                for row in &rows {
                    // Rows of each term merge past the term's bytes.
                    let strip = decode_str(&row.clustering).map_or(0, |(_, n)| n);
                    if let Some((impact, id)) = parse_row(row, strip, def.impacts) {
                        s.last = impact;
                        let known = seen.entry(id).or_insert_with_key(|id| {
                            fresh.push(id.clone());
                            vec![None; n_slots]
                        });
                        known[i].get_or_insert(impact);
                    }
                }
                s.complete = s.merge.finished();
                if s.complete || s.read >= SCAN_BUDGET {
                    s.done = true;
                }
            }
            // Each candidate's impact in every word: known from the rows
            // read, absent from a word read to its end, or else read from
            // its forward row (random access). Random access waits while
            // sorted access is cheap (see [`DEFER_LOOKUPS`]), and is spent
            // only on candidates that could still make the page.
            partial.extend(fresh);
            let lookups_now = slots.iter().any(|s| s.done || s.read >= DEFER_LOOKUPS);
            let floor = if best.len() >= want {
                best.keys().last().map(|w| w.score)
            } else {
                None
            };
            let mut found: Vec<(String, Vec<Option<u32>>)> = Vec::new();
            let mut lookup: Vec<String> = Vec::new();
            for id in std::mem::take(&mut partial) {
                let known = &seen[&id];
                let settled = known
                    .iter()
                    .zip(&slots)
                    .all(|(k, s)| k.is_some() || s.absent());
                let lacks_one = known
                    .iter()
                    .zip(&slots)
                    .any(|(k, s)| k.is_none() && s.absent());
                if q.all && lacks_one {
                    continue;
                }
                if settled {
                    found.push((id, known.clone()));
                } else if floor.is_some_and(|f| upper_bound(known, &slots, q.all) < f) {
                    // Worse than the page's last place whatever it lacks.
                } else if lookups_now {
                    lookup.push(id);
                } else {
                    partial.push(id);
                }
            }
            lookup.sort();
            let keys: Vec<Key> = lookup.iter().map(|id| forward_key(def, id)).collect();
            let fwd = crate::read(snap, &keys, &[]).await?.rows;
            for (id, row) in lookup.into_iter().zip(fwd) {
                if let Some(row) = row {
                    found.push((id, slot_impacts(&row.value, &slots, def.impacts)?));
                }
            }
            for (id, impacts) in found {
                let mut sum = 0u64;
                let mut matched = 0u64;
                for i in impacts.into_iter().flatten() {
                    sum += u64::from(i);
                    matched += 1;
                }
                let passes = if q.all {
                    matched == slots.len() as u64
                } else {
                    matched > 0
                };
                if !passes {
                    continue;
                }
                let score = if q.all { sum } else { matched * MATCHED + sum };
                let place = Place { score, id };
                if cursor.is_some_and(|c| place <= *c) {
                    continue;
                }
                best.insert(place, ());
                if best.len() > want {
                    best.pop_last();
                }
            }
            // The best any unread item could score. A prefix of terms left
            // out stays in it once read to its end, at its last row's
            // impact, which bounds [`LEFT_OUT`] too.
            let open: Vec<&Slot> = slots
                .iter()
                .filter(|s| !s.done || s.unexpanded.is_some())
                .collect();
            let bound = if slots.iter().all(|s| s.done) {
                None
            } else if q.all {
                if slots.iter().any(|s| s.done && s.unexpanded.is_none()) {
                    // A word read to its end: every item with all words
                    // has been seen.
                    None
                } else {
                    Some(open.iter().map(|s| u64::from(s.last)).sum::<u64>())
                }
            } else {
                Some(
                    open.iter()
                        .map(|s| MATCHED + u64::from(s.last))
                        .sum::<u64>(),
                )
            };
            let full = best.len() >= want;
            if !partial.is_empty() {
                // The bound covers unseen items only: a candidate not yet
                // scored could still beat it.
                batch = (batch * 2).min(1024);
                continue;
            }
            match bound {
                None => break,
                Some(b) if full && best.keys().last().is_some_and(|w| w.score > b) => break,
                Some(_) => {}
            }
            batch = (batch * 2).min(1024);
        }
        Ok(best.into_keys().collect())
    }

    /// The terms that start with `prefix` in `partitions`: the caller's
    /// partitions of each of the `heads` its terms may start with
    /// ([`prefix_heads`]). Each round reads a few rows of every partition
    /// still open and then skips the rest of the last term it saw, so a
    /// term held by many items costs one row, not all of them: at most
    /// [`EXPAND_ROUNDS`] reads per partition, the first of [`EXPAND_FIRST`]
    /// rows and the others of [`EXPAND_ROWS`], each shared among the heads
    /// (at least two rows a read).
    async fn expand(
        &self,
        snap: &mut Box<dyn Snapshot>,
        partitions: &[Vec<u8>],
        heads: usize,
        prefix: &str,
    ) -> Result<Expansion> {
        let lower = encoded_prefix(prefix);
        let upper = successor(&lower).map_or(Bound::Unbounded, Bound::Excluded);
        let mut from: Vec<Option<Bound<Vec<u8>>>> =
            vec![Some(Bound::Included(lower)); partitions.len()];
        let mut terms: Vec<String> = Vec::new();
        let mut listed: Vec<HashSet<String>> = vec![HashSet::new(); partitions.len()];
        for round in 0..EXPAND_ROUNDS {
            let rows_per = if round == 0 {
                EXPAND_FIRST
            } else {
                EXPAND_ROWS
            };
            let rows_per = (rows_per / heads.max(1)).max(2);
            let open: Vec<usize> = (0..partitions.len())
                .filter(|i| from[*i].is_some())
                .collect();
            if open.is_empty() || terms.len() >= MAX_EXPANSION {
                break;
            }
            let scans: Vec<Scan> = open
                .iter()
                .map(|i| {
                    let lower = from[*i].clone().expect("open");
                    Scan::partition(INDEX, partitions[*i].clone(), rows_per)
                        .bounds(lower, upper.clone())
                })
                .collect();
            let out = crate::read(snap, &[], &scans).await?;
            for (i, rows) in open.into_iter().zip(out.scans) {
                let mut last = None;
                for r in &rows {
                    if let Some((t, n)) = decode_str(&r.clustering) {
                        last = Some(r.clustering[..n].to_vec());
                        if !terms.contains(&t) {
                            terms.push(t.clone());
                        }
                        listed[i].insert(t);
                    }
                }
                // Past every row of the last term seen.
                from[i] = match last.and_then(|l| successor(&l)) {
                    Some(next) if rows.len() == rows_per => Some(Bound::Included(next)),
                    _ => None,
                };
            }
        }
        // The shortest first: the words being typed are likeliest.
        terms.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
        let whole = terms.len() <= MAX_EXPANSION && from.iter().all(Option::is_none);
        terms.truncate(MAX_EXPANSION);
        let listed = partitions
            .iter()
            .zip(listed)
            .zip(from)
            .filter(|(_, open)| open.is_none())
            .map(|((p, l), _)| (p.clone(), l))
            .collect();
        Ok(Expansion {
            prefix: prefix.to_string(),
            terms,
            listed,
            whole,
        })
    }
}

/// The text indexes a search reads: the one of `kind` whose where-fields
/// are exactly those given; without a kind, every one without where-fields.
fn choose(
    defs: &[IndexDef],
    kind: Option<&str>,
    fields: &BTreeMap<String, Value>,
) -> Result<Vec<IndexDef>> {
    let mut building = None;
    let mut out = Vec::new();
    for d in defs.iter().filter(|d| d.is_text()) {
        let fits = match kind {
            Some(k) => {
                d.kind.as_deref() == Some(k)
                    && d.where_.len() == fields.len()
                    && d.where_.iter().all(|f| fields.contains_key(f))
            }
            // Where-fields belong to a kind's text index: without a kind
            // none serves them (the advice below names one to declare).
            None => fields.is_empty() && d.where_.is_empty(),
        };
        if !fits {
            continue;
        }
        match d.state {
            IndexState::Ready => {
                out.push(d.clone());
                if kind.is_some() {
                    break;
                }
            }
            IndexState::Building => building = Some(d.name.clone()),
            IndexState::Dropping => {}
        }
    }
    // Without a kind, an index still being built would leave its kind's
    // items out of a page that looks whole: the search waits for it.
    if let Some(name) = building {
        if out.is_empty() || kind.is_none() {
            return Err(EngineError::IndexBuilding(name));
        }
    }
    if !out.is_empty() {
        return Ok(out);
    }
    // Fields no index can have are bad input, not a missing index.
    crate::indexes::check_fields(fields.keys())?;
    // Without a kind, the advice is for a kind of the caller's choosing.
    let k = kind.unwrap_or("<kind>");
    // The advice must be one the administrator can follow: a name no index
    // has, and the fields of the kind's other text index if it has one.
    let mut name = format!("{k}-text");
    if !fields.is_empty() {
        name = format!(
            "{name}-by-{}",
            fields.keys().cloned().collect::<Vec<_>>().join("-")
        );
    }
    let name = crate::indexes::free_name(defs, &name);
    let text = match defs.iter().find(|d| {
        d.is_text()
            && d.state != IndexState::Dropping
            && kind.is_some()
            && d.kind.as_deref() == kind
    }) {
        Some(d) => d
            .text
            .iter()
            .map(|t| {
                serde_json::json!({"field": crate::indexes::written_field(&t.field), "weight": t.weight})
            })
            .collect(),
        None => serde_json::json!([{"field": "title", "weight": 3}, {"field": "description"}]),
    };
    let declare = serde_json::json!({
        "kind": k,
        "where": fields
            .keys()
            .map(|f| crate::indexes::written_field(f))
            .collect::<Vec<_>>(),
        "text": text,
    });
    Err(EngineError::NoIndex {
        what: "search",
        name,
        declare: declare.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::indexes::TextField;

    /// The textual bodies are the types api.md names, with parameters.
    #[test]
    fn textual_bodies_are_the_types_the_contract_names() {
        for t in [
            "text/plain",
            "text/markdown; charset=utf-8",
            "Application/JSON",
            "application/xml",
        ] {
            assert!(super::is_textual(t), "{t}");
        }
        for t in [
            "image/svg+xml",
            "application/ld+json",
            "image/png",
            "application/pdf",
            "textual/x",
        ] {
            assert!(!super::is_textual(t), "{t}");
        }
    }

    /// Every word's term of these languages lives in a partition its first
    /// character's prefix reads.
    #[test]
    fn one_character_prefixes_of_indic_scripts_read_at_most_130_heads() {
        for first in ["क", "ক", "ਕ", "க", "ക", "ක", "ଓ"] {
            let n = prefix_heads(first).len();
            assert!((60..=130).contains(&n), "{first}: {n}");
        }
    }

    #[test]
    fn one_character_prefixes_read_the_heads_of_their_words() {
        let samples = [
            (
                "english",
                "o'brien l’eau 1,000 3.14 don't x-ray e-mail brewing",
            ),
            ("french", "l’été d’un œuvre être garçon"),
            ("german", "straße größe über äpfel"),
            ("spanish", "año niño pingüino"),
            ("danish", "æble øl gøy"),
            ("norwegian", "bøker høst"),
            ("swedish", "åsna över"),
            ("turkish", "ağaç ıslak şehir öğretmen"),
            ("none", "łódź źdźbło gęś aħna gəl kɔ"),
            ("none", "l·lusió a:b"),
            ("russian", "йогурт ёлка щи объём"),
            ("none", "п'ять м’ясо пјесма қазақ әке"),
            ("greek", "λέξη ψυχή ς όλος"),
            ("arabic", "مرحبا حاسوب أحمد إسلام آمن مؤمن سئل القرآن"),
            ("none", "مرحبا پنجره گل کتاب یک"),
            ("none", "שָׁלוֹם שלום ספר מים"),
            ("none", "բարեւ ձմեռ"),
            ("none", "გამარჯობა"),
            ("none", "タワー コーヒー ｶﾀｶﾅ ガラス"),
            ("none", "काम कम क़िला हिन्दी ऋषि"),
            ("none", "বাংলা ভাষা"),
            ("tamil", "தமிழ் மொழி"),
            ("none", "සිංහල පාසල ਇੱਕ ਪੰਜਾਬ আৰু എൻ്റെ ଓଡ଼ିଆ"),
            ("none", "ג׳ירפה צה״ל"),
        ];
        for (language, text) in samples {
            let analyzer = Analyzer::new(language);
            for w in words(text) {
                let term = analyzer.term(&w);
                let h = head(Heads::Syllable, &term);
                let first: String = h.chars().take(1).collect();
                assert!(
                    prefix_heads(&first).iter().any(|p| p == h),
                    "{language}: {w} (term {term}, head {h}) is not read by the prefix {first}"
                );
            }
        }
        // Another script: the whole word only, one partition.
        assert_eq!(prefix_heads("字"), vec!["字".to_string()]);
        assert_eq!(prefix_heads("검"), vec!["검".to_string()]);
        assert_eq!(prefix_heads("ab"), vec!["ab".to_string()]);
    }

    #[test]
    fn impact_codes_keep_order_past_the_fine_range() {
        let stepped = Impacts::Stepped;
        let mut last = 0;
        for milli in (1..2_200_000u32).step_by(7) {
            let code = stepped.code(milli);
            assert!(code >= last, "{milli}");
            last = code;
            assert_eq!(stepped.code(stepped.milli(code)), code, "{milli}");
            // Exact below FINE, within a step above it.
            let top = stepped.milli(u16::MAX);
            assert!(stepped.milli(code) >= milli.min(top));
            assert!(stepped.milli(code) - milli.min(stepped.milli(code)) < COARSE);
        }
        // Eight fields of weight 100 fit; any word sum of a query too.
        assert!(stepped.milli(u16::MAX) >= 8 * 100 * 2_200);
        assert!(MAX_WORDS as u64 * u64::from(stepped.milli(u16::MAX)) < MATCHED);
        // Older declarations keep the codes their rows hold.
        let milli = Impacts::Milli;
        for m in [1, 32_767, 32_768, 40_000, 65_535] {
            assert_eq!(milli.code(m), m as u16);
            assert_eq!(milli.milli(m as u16), m);
        }
        assert_eq!(milli.code(200_000), u16::MAX);
    }

    fn def(name: &str, kind: &str, state: IndexState) -> IndexDef {
        IndexDef {
            name: name.into(),
            kind: Some(kind.into()),
            where_: Vec::new(),
            sort: Vec::new(),
            state,
            uid: name.into(),
            since: 0,
            text: vec![TextField {
                field: "title".into(),
                weight: 1.0,
            }],
            language: None,
            ties: crate::Order::Asc,
            impacts: Impacts::Stepped,
            readers: crate::indexes::Readers::Widest,
            heads: Heads::Syllable,
            cut: crate::Cut::Byte,
        }
    }

    #[test]
    fn a_search_without_kind_waits_for_every_index_it_would_read() {
        let defs = [
            def("a-text", "a", IndexState::Ready),
            def("b-text", "b", IndexState::Building),
        ];
        let none = BTreeMap::new();
        assert!(matches!(
            choose(&defs, None, &none),
            Err(EngineError::IndexBuilding(n)) if n == "b-text"
        ));
        // With a kind, only that kind's index counts.
        assert_eq!(choose(&defs, Some("a"), &none).unwrap()[0].name, "a-text");
        assert!(matches!(
            choose(&defs, Some("b"), &none),
            Err(EngineError::IndexBuilding(_))
        ));
    }
}

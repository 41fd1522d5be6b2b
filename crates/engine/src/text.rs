//! Word analysis for full-text search, from well-kept crates: Unicode word
//! segmentation (`unicode-segmentation`, UAX #29), compatibility
//! decomposition and removal of combining marks (`unicode-normalization`:
//! `café` → `cafe`, `ﬁ` → `fi`), lower-casing, and Snowball stemming
//! (`rust-stemmers`: `brewing` → `brew`).
//!
//! Everything here depends on the text alone, never on other items.

use std::collections::HashMap;

use rust_stemmers::{Algorithm, Stemmer};
use unicode_normalization::char::is_combining_mark;
use unicode_normalization::UnicodeNormalization;
use unicode_segmentation::UnicodeSegmentation;

/// Longest term kept, in bytes; longer words are cut (at a character
/// boundary).
pub const MAX_TERM: usize = 64;
/// Most characters a stem is shorter than a word typed on its way to a
/// word with that stem ("generalizat" of "generalization", term "general").
pub const STEM_CUT: usize = 4;

/// The languages a text index may name, and `none` for no stemming.
pub const LANGUAGES: &[&str] = &[
    "arabic",
    "danish",
    "dutch",
    "english",
    "finnish",
    "french",
    "german",
    "greek",
    "hungarian",
    "italian",
    "norwegian",
    "portuguese",
    "romanian",
    "russian",
    "spanish",
    "swedish",
    "tamil",
    "turkish",
    "none",
];

fn algorithm(language: &str) -> Option<Algorithm> {
    Some(match language {
        "arabic" => Algorithm::Arabic,
        "danish" => Algorithm::Danish,
        "dutch" => Algorithm::Dutch,
        "english" => Algorithm::English,
        "finnish" => Algorithm::Finnish,
        "french" => Algorithm::French,
        "german" => Algorithm::German,
        "greek" => Algorithm::Greek,
        "hungarian" => Algorithm::Hungarian,
        "italian" => Algorithm::Italian,
        "norwegian" => Algorithm::Norwegian,
        "portuguese" => Algorithm::Portuguese,
        "romanian" => Algorithm::Romanian,
        "russian" => Algorithm::Russian,
        "spanish" => Algorithm::Spanish,
        "swedish" => Algorithm::Swedish,
        "tamil" => Algorithm::Tamil,
        "turkish" => Algorithm::Turkish,
        _ => return None,
    })
}

/// Whether `language` is one a text index may name.
pub fn is_language(language: &str) -> bool {
    LANGUAGES.contains(&language)
}

/// Folds one word: compatibility decomposition, combining marks removed,
/// lower case, recomposed; cut to [`MAX_TERM`] bytes.
pub fn fold(word: &str) -> String {
    let folded: String = word
        .nfkd()
        .filter(|c| !is_combining_mark(*c) && !c.is_control())
        .flat_map(char::to_lowercase)
        .nfc()
        .collect();
    crate::keys::prefix(&folded, MAX_TERM).to_string()
}

/// The folded words of a text, in order (not stemmed).
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.unicode_words().map(fold).filter(|w| !w.is_empty())
}

/// Stems folded words for one language.
pub struct Analyzer {
    stemmer: Option<Stemmer>,
}

impl Analyzer {
    /// The analyzer of `language` (no stemming for `none` or an unknown
    /// name).
    pub fn new(language: &str) -> Analyzer {
        Analyzer {
            stemmer: algorithm(language).map(Stemmer::create),
        }
    }

    /// The term of a folded word.
    pub fn term(&self, folded: &str) -> String {
        match &self.stemmer {
            Some(s) => crate::keys::prefix(&s.stem(folded), MAX_TERM).to_string(),
            None => folded.to_string(),
        }
    }

    /// The terms a stemmed word may have whose surface starts with the
    /// folded `typed` but whose term is shorter than it: its prefixes of
    /// [`STEM_CUT`] or fewer characters less, and never under three
    /// characters (the partition of a term is its first two). None without
    /// a stemmer, where a term is its word.
    pub fn stems_typed_past(&self, typed: &str) -> Vec<String> {
        if self.stemmer.is_none() {
            return Vec::new();
        }
        let ends: Vec<usize> = typed.char_indices().map(|(i, _)| i).skip(1).collect();
        let shortest = ends.len().saturating_sub(STEM_CUT).max(2);
        ends.get(shortest..)
            .unwrap_or_default()
            .iter()
            .map(|end| typed[..*end].to_string())
            .collect()
    }

    /// The terms of a text, in order.
    pub fn terms<'a>(&'a self, text: &'a str) -> impl Iterator<Item = String> + 'a {
        words(text).map(|w| self.term(&w))
    }
}

/// Word counts of a text: the words most often used first, at most `keep`
/// of them (ties by word), and the number of words in all. This is what an
/// item body keeps for indexing: its most weighty words.
pub fn word_counts(text: &str, keep: usize) -> (Vec<(String, u32)>, u32) {
    let mut counts: HashMap<String, u32> = HashMap::new();
    let mut total = 0u32;
    for w in words(text) {
        total = total.saturating_add(1);
        *counts.entry(w).or_insert(0) += 1;
    }
    let mut v: Vec<(String, u32)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v.truncate(keep);
    (v, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_typed_past_its_stem_reaches_it() {
        let en = Analyzer::new("english");
        assert_eq!(en.stems_typed_past("brewi"), ["bre", "brew"]);
        assert!(en.stems_typed_past("brewin").contains(&en.term("brewing")));
        let typed = "generalizat";
        assert!(en
            .stems_typed_past(typed)
            .contains(&en.term("generalization")));
        assert_eq!(en.stems_typed_past("caf\u{e9}s"), ["caf", "caf\u{e9}"]);
        assert!(en.stems_typed_past("br").is_empty());
        assert!(en.stems_typed_past("bre").is_empty());
        assert!(Analyzer::new("none").stems_typed_past("brewi").is_empty());
    }

    #[test]
    fn folding_and_stemming() {
        let en = Analyzer::new("english");
        let t = |s: &str| en.terms(s).collect::<Vec<_>>();
        assert_eq!(t("Brewing"), t("brew"));
        assert_eq!(t("café"), t("Cafe"));
        assert_eq!(t("CAFÉS"), t("cafe"));
        assert_eq!(t("ﬁnd"), t("find"), "compatibility forms");
        assert_eq!(
            t("green-tea, GREEN tea!"),
            vec!["green", "tea", "green", "tea"]
        );
        assert_eq!(t("naïve résumé"), t("naive resume"));
        // Scripts without case or marks pass through; emoji and marks alone
        // make no word.
        assert!(words("日本語のテキスト").count() > 0);
        assert_eq!(words("🍵🍵 ✨").count(), 0);
        assert_eq!(words("\u{301}\u{301}").count(), 0);
        assert_eq!(words("a\0b").collect::<Vec<_>>().len(), 2);
        // RTL text is words like any other.
        assert_eq!(words("שלום עולם").count(), 2);
        let long = "x".repeat(500);
        assert!(fold(&long).len() <= MAX_TERM);
        let none = Analyzer::new("none");
        assert_eq!(none.terms("Brewing").collect::<Vec<_>>(), vec!["brewing"]);
        let fr = Analyzer::new("french");
        assert_eq!(
            fr.terms("chevaux").collect::<Vec<_>>(),
            fr.terms("cheval").collect::<Vec<_>>()
        );
    }

    #[test]
    fn body_keeps_its_most_used_words() {
        let (counts, total) = word_counts("b a b c b a", 2);
        assert_eq!(total, 6);
        assert_eq!(counts, vec![("b".to_string(), 3), ("a".to_string(), 2)]);
    }
}

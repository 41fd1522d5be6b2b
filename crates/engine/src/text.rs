//! Word analysis for full-text search, from well-kept crates: Unicode word
//! segmentation (`unicode-segmentation`, UAX #29), compatibility
//! decomposition and removal of accents (`unicode-normalization`:
//! `café` → `cafe`, `ﬁ` → `fi`), lower-casing, and Snowball stemming
//! (`rust-stemmers`: `brewing` → `brew`).
//!
//! Everything here depends on the text alone, never on other items.

use std::collections::HashMap;

use rust_stemmers::{Algorithm, Stemmer};
use unicode_normalization::char::is_combining_mark;
use unicode_normalization::UnicodeNormalization;
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
use unicode_segmentation::UnicodeSegmentation;

/// Longest term kept, in bytes; longer words are cut (at a character
/// boundary).
pub const MAX_TERM: usize = 64;

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

/// Whether `c` is a mark that only accents a letter, and goes in folding:
/// those of the blocks of combining diacritics (Latin, Greek and Cyrillic
/// accents: `café` is `cafe`), and the vowel points of Hebrew and Arabic,
/// which most text is written without (as Lucene's Arabic normaliser
/// drops them). Other marks are part of their letter and stay: an Indic
/// vowel sign or virama (`काम` is not `कम`), a kana's voicing mark
/// (`ガラス` is not `カラス`); so do the points of other scripts, which
/// no one here has asked to fold.
fn is_accent(c: char) -> bool {
    matches!(c,
        '\u{0300}'..='\u{036F}'
        | '\u{1AB0}'..='\u{1AFF}'
        | '\u{1DC0}'..='\u{1DFF}'
        | '\u{20D0}'..='\u{20FF}'
        | '\u{FE20}'..='\u{FE2F}'
        | '\u{0591}'..='\u{05C7}'
        | '\u{0610}'..='\u{061A}'
        | '\u{064B}'..='\u{065F}'
        | '\u{0670}'
        | '\u{06D6}'..='\u{06ED}')
        && is_combining_mark(c)
}

/// Folds one word: compatibility decomposition, accents ([`is_accent`]) and
/// invisible format characters removed (a soft hyphen, a direction mark, a
/// zero-width joiner: Unicode's category Cf, which word segmentation keeps
/// inside a word, so `hy\u{AD}phenate` is `hyphenate`), lower case,
/// letters [`spelled`] as plain ones, recomposed; cut to [`MAX_TERM`]
/// bytes.
pub fn fold(word: &str) -> String {
    let folded: String = word
        .nfkd()
        .filter(|c| {
            !is_accent(*c)
                && !c.is_whitespace()
                && !c.is_control()
                && c.general_category() != GeneralCategory::Format
        })
        .flat_map(char::to_lowercase)
        .flat_map(spelled)
        .nfc()
        .collect();
    crate::keys::prefix(&folded, MAX_TERM).to_string()
}

/// A lower-case letter as [`fold`] spells it: the two folds of full case
/// folding that lower case lacks (`ß` is `ss`, a final `ς` is `σ`); the
/// letters with a stroke or a bar and the ligatures, which decomposition
/// leaves whole, as the letters they are written with (`ł` is `l`, `ø`
/// is `o`, `æ` is `ae`: Łódź is found by `lodz`); and the apostrophes
/// that word segmentation keeps inside a word (`’`, `‘`, `ʼ`) as `'`.
fn spelled(c: char) -> std::iter::Take<std::array::IntoIter<char, 2>> {
    let (pair, n) = match c {
        'ß' => (['s', 's'], 2),
        'ς' => (['σ', ' '], 1),
        'æ' => (['a', 'e'], 2),
        'œ' => (['o', 'e'], 2),
        'þ' => (['t', 'h'], 2),
        'ł' => (['l', ' '], 1),
        'ø' => (['o', ' '], 1),
        'đ' | 'ð' => (['d', ' '], 1),
        'ħ' => (['h', ' '], 1),
        'ŧ' => (['t', ' '], 1),
        'ı' => (['i', ' '], 1),
        'ƀ' => (['b', ' '], 1),
        'ɨ' => (['i', ' '], 1),
        'ƶ' => (['z', ' '], 1),
        'ǥ' => (['g', ' '], 1),
        '’' | '‘' | 'ʼ' => (['\'', ' '], 1),
        c => ([c, ' '], 1),
    };
    pair.into_iter().take(n)
}

/// The folded words of a text, in order (not stemmed).
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.unicode_words().map(fold).filter(|w| !w.is_empty())
}

/// Stems folded words for one language.
pub struct Analyzer {
    stemmer: Option<Stemmer>,
    /// Every tail of every ending of the language, once each.
    tails: &'static [&'static str],
}

/// Endings English words take past their stem, inflections and the common
/// derivations: what a word being typed may still become.
const ENGLISH_ENDINGS: &[&str] = &[
    "s", "es", "ed", "ing", "ings", "er", "ers", "est", "ly", "ness", "ment", "ments", "ation",
    "ations", "ization", "izations", "ize", "izes", "ized", "izing", "ise", "ised", "ising", "ity",
    "ities", "ies", "ied", "ful", "less", "able", "ability", "ible", "al", "ally", "ous", "ive",
    "ence", "ance", "ent", "ant", "ism", "ist", "ists", "ion", "ions", "ional",
];

static ENGLISH_TAILS: std::sync::LazyLock<Vec<&'static str>> = std::sync::LazyLock::new(|| {
    let mut tails: Vec<&'static str> = ENGLISH_ENDINGS
        .iter()
        .flat_map(|e| e.char_indices().map(move |(i, _)| &e[i..]))
        .collect();
    tails.sort_unstable();
    tails.dedup();
    tails
});

/// The tails of the endings of `language` (see [`ENGLISH_ENDINGS`]).
fn endings(language: &str) -> &'static [&'static str] {
    match language {
        "english" => ENGLISH_TAILS.as_slice(),
        _ => &[],
    }
}

impl Analyzer {
    /// The analyzer of `language` (no stemming for `none` or an unknown
    /// name).
    pub fn new(language: &str) -> Analyzer {
        Analyzer {
            stemmer: algorithm(language).map(Stemmer::create),
            tails: endings(language),
        }
    }

    /// The term of a folded word.
    pub fn term(&self, folded: &str) -> String {
        match &self.stemmer {
            Some(s) => crate::keys::prefix(&s.stem(folded), MAX_TERM).to_string(),
            None => folded.to_string(),
        }
    }

    /// The terms of the words that complete `typed` (folded) that do not
    /// start with it: `typed` with the rest of each of its language's
    /// [`endings`] (`brewi` + `ng`), stemmed, kept when the term is not
    /// one a prefix read of `typed` reaches — one that ends before it
    /// (`brewing` is `brew`), or whose stem spells its last letters
    /// otherwise (`dyi` + `ng` is `die`, `cryi` + `ng` is `cri`, `skie` +
    /// `s` is `sky`). At least two characters typed and three in a term;
    /// none for a language without endings listed, or without a stemmer.
    pub fn stems_typed_past(&self, typed: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        if self.stemmer.is_none() || typed.chars().count() < 2 {
            return out;
        }
        let mut word = String::with_capacity(typed.len() + 16);
        for rest in self.tails {
            word.clear();
            word.push_str(typed);
            word.push_str(rest);
            let term = self.term(&word);
            if !term.starts_with(typed) && term.chars().count() >= 3 && !out.contains(&term) {
                out.push(term);
            }
        }
        out
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
        let past = |typed: &str| en.stems_typed_past(typed);
        assert_eq!(past("brewi"), ["brew"]);
        assert!(past("brewin").contains(&"brew".to_string()));
        assert!(past("brewin")
            .iter()
            .all(|t| "brewin".starts_with(t.as_str())));
        assert!(past("generalizat").contains(&en.term("generalization")));
        assert!(past("happine").contains(&en.term("happiness")));
        // Only stems of words that complete what was typed: no "the" for
        // "theory", no "for" for "format", no "car" for "carton".
        for (typed, never) in [
            ("theory", ["the", "theo", "theor"]),
            ("format", ["for", "form", "forma"]),
            ("andrew", ["and", "andr", "andre"]),
            ("carton", ["car", "cart", "ca"]),
        ] {
            let got = past(typed);
            assert!(
                never.iter().all(|n| !got.iter().any(|t| t == n)),
                "{typed}: {got:?}"
            );
        }
        assert!(past("brew").is_empty() && past("tea").is_empty());
        // Stems that spell a word's last letters otherwise.
        for (word, typed) in [
            ("dying", ["dy", "dyi", "dyin"].as_slice()),
            ("crying", &["cry", "cryi", "cryin"]),
            ("skies", &["ski", "skie"]),
            ("studies", &["studie"]),
            ("happily", &["happ", "happil"]),
        ] {
            let term = en.term(word);
            for typed in typed {
                assert!(
                    typed.starts_with(term.as_str())
                        || term.starts_with(typed)
                        || past(typed).contains(&term),
                    "{typed} does not reach {term}, the term of {word}: {:?}",
                    past(typed)
                );
            }
        }
        // A handful of terms at most, even for two letters.
        for typed in ["dy", "th", "an", "re", "co", "generalizat", "happine"] {
            assert!(past(typed).len() <= 12, "{typed}: {:?}", past(typed));
        }
        // Letters of several bytes (that folding keeps) cut nowhere else.
        assert!(past("brødi")
            .iter()
            .all(|t| "brødi".starts_with(t.as_str())));
        assert!(Analyzer::new("none").stems_typed_past("brewi").is_empty());
        assert!(Analyzer::new("french").stems_typed_past("brewi").is_empty());
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
        // Full case folding where lower case stops short.
        assert_eq!(t("Straße"), t("STRASSE"));
        assert_eq!(t("ΟΔΟΣ"), t("οδος"));
        // Letters with a stroke, ligatures, apostrophes.
        assert_eq!(t("Łódź København Øl Æsir"), t("lodz kobenhavn ol aesir"));
        assert_eq!(t("Đakovo Þór"), t("dakovo thor"));
        assert_eq!(t("l’eau O‘Brien"), t("l'eau o'brien"));
        // Scripts without case or marks pass through; emoji and marks alone
        // make no word.
        assert!(words("日本語のテキスト").count() > 0);
        assert_eq!(words("🍵🍵 ✨").count(), 0);
        assert_eq!(words("\u{301}\u{301}").count(), 0);
        assert_eq!(words("a\0b").collect::<Vec<_>>().len(), 2);
        // RTL text is words like any other.
        assert_eq!(words("שלום עולם").count(), 2);
        // Invisible format characters inside a word (category Cf) go: a
        // soft hyphen, direction marks and overrides, joiners.
        assert_eq!(
            words(
                "hy\u{AD}phenate mark\u{200E} \u{202E}evil\u{202C} word\u{2060}joiner z\u{200D}w"
            )
            .collect::<Vec<_>>(),
            vec!["hyphenate", "mark", "evil", "wordjoiner", "zw"]
        );
        assert_eq!(words("\u{200B}\u{FEFF}").count(), 0);
        let long = "x".repeat(500);
        assert!(fold(&long).len() <= MAX_TERM);
        let none = Analyzer::new("none");
        assert_eq!(none.terms("Brewing").collect::<Vec<_>>(), vec!["brewing"]);
        // Marks that are part of their letter stay (an audit found that
        // crow found glass, and "less" found "work"): kana voicing marks,
        // Indic vowel signs and viramas. Hebrew and Arabic vowel points go.
        assert_ne!(fold("ガラス"), fold("カラス"));
        assert_eq!(fold("ガラス"), "ガラス", "recomposed");
        assert_ne!(fold("がき"), fold("かき"));
        assert_ne!(fold("काम"), fold("कम"));
        assert_ne!(fold("பால்"), fold("பல"));
        assert_eq!(fold("שָׁלוֹם"), fold("שלום"));
        assert_eq!(fold("كَتَبَ"), fold("كتب"));
        assert_eq!(fold("Việt"), "viet");
        // A spacing voicing mark decomposes to a space and the mark: the
        // space goes.
        assert_eq!(fold("カ\u{309B}"), "ガ");
        let ta = Analyzer::new("tamil");
        assert_eq!(
            ta.terms("புத்தகங்கள்").collect::<Vec<_>>(),
            ta.terms("புத்தகம்").collect::<Vec<_>>(),
            "the Tamil stemmer sees the marks it stems by"
        );
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

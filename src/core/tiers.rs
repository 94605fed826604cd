//! Token budgets and the assembly of Tier 0/1/2 context within them.
//!
//! Tokens are estimated as `ceil(utf16_units / 4)`: four characters a token,
//! counted the way the JavaScript peers count `String.length`. Every tier's
//! text is complete as rendered (headers and separators included), so the
//! rendered prompt is the plain concatenation of the tiers and its estimate
//! never exceeds the sum of the tier estimates, which never exceed the budgets.

use serde::Serialize;

/// Characters per token in the estimate.
pub const CHARS_PER_TOKEN: usize = 4;

/// Returns the token estimate of `text`: `ceil(utf16_len / 4)`.
///
/// # Examples
/// ```
/// use capdex::core::tiers::estimate_tokens;
/// assert_eq!(estimate_tokens(""), 0);
/// assert_eq!(estimate_tokens("abcde"), 2);
/// ```
pub fn estimate_tokens(text: &str) -> usize {
    utf16_len(text).div_ceil(CHARS_PER_TOKEN)
}

/// Returns the length of `text` in UTF-16 units (`text.encode_utf16().count()`),
/// from its bytes: every byte that starts a character counts one unit, and
/// a four-byte character (outside the basic plane, a surrogate pair) one more.
///
/// ASCII text (most of it) is its byte length, which `is_ascii` checks a
/// word at a time; other text is counted in `u8` lanes, which vectorise
/// (each byte adds at most 2, so a chunk of 127 cannot overflow). Tier
/// assembly measures every line it places, so this runs on every byte of
/// every reply more than once.
///
/// # Examples
/// ```
/// use capdex::core::tiers::utf16_len;
/// assert_eq!(utf16_len("abc"), 3);
/// assert_eq!(utf16_len("é—😀"), 4);
/// ```
pub fn utf16_len(text: &str) -> usize {
    let bytes = text.as_bytes();
    if bytes.is_ascii() {
        return bytes.len();
    }
    bytes
        .chunks(127)
        .map(|chunk| {
            usize::from(
                chunk.iter().fold(0u8, |units, &byte| units + u8::from(byte & 0xC0 != 0x80) + u8::from(byte >= 0xF0)),
            )
        })
        .sum()
}

/// A maximum number of tokens; zero is allowed and means "emit nothing".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TokenBudget(usize);

impl TokenBudget {
    pub const fn new(max_tokens: usize) -> TokenBudget {
        TokenBudget(max_tokens)
    }

    pub const fn max_tokens(self) -> usize {
        self.0
    }

    /// Returns the number of UTF-16 units that fit.
    pub const fn max_units(self) -> usize {
        self.0 * CHARS_PER_TOKEN
    }
}

/// Cuts `text` so that it holds at most `max_units` UTF-16 units, never
/// splitting a character; an abridged text ends with `marker` (counted).
pub fn cut_to_units(text: &str, max_units: usize, marker: &str) -> String {
    if utf16_len(text) <= max_units {
        return text.to_string();
    }
    let marker_units = utf16_len(marker);
    if marker_units > max_units {
        return String::new();
    }
    let room = max_units - marker_units;
    let mut used = 0;
    // The byte length of the longest prefix of whole characters that fits.
    let mut end = 0;
    for (at, ch) in text.char_indices() {
        if used + ch.len_utf16() > room {
            break;
        }
        used += ch.len_utf16();
        end = at + ch.len_utf8();
    }
    let mut out = String::with_capacity(end + marker.len());
    out.push_str(&text[..end]);
    out.push_str(marker);
    out
}

/// One capability as Tier 0 sees it.
#[derive(Clone, Debug)]
pub struct CategoryMember<'a> {
    pub category: &'a str,
    pub name: &'a str,
}

const TIER0_HEADER: &str = "Available capability categories:\n";
const TIER0_FOOTER: &str = "Use discover_capabilities tool to get details on any capability.\n";
/// Names listed per category line before `(+n more)`.
const TIER0_NAMES_PER_CATEGORY: usize = 4;

/// Builds the Tier 0 category map within `budget`.
///
/// Categories are listed by size (ties by name). A line that does not fit in
/// full is shortened to its count; when even that does not fit, the map ends
/// with how many categories were left out. Returns "" for a budget too small
/// for the header.
pub fn assemble_tier0(members: &[CategoryMember<'_>], budget: TokenBudget) -> String {
    let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
    {
        let mut by_category: std::collections::BTreeMap<String, Vec<&str>> = std::collections::BTreeMap::new();
        for member in members {
            let category = if member.category.is_empty() { "other" } else { member.category };
            by_category.entry(category.to_lowercase()).or_default().push(member.name);
        }
        groups.extend(by_category);
    }
    groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then_with(|| a.0.cmp(&b.0)));
    let max_units = budget.max_units();
    let fixed = utf16_len(TIER0_HEADER) + utf16_len(TIER0_FOOTER);
    if fixed > max_units {
        return cut_to_units(TIER0_HEADER, max_units, "");
    }
    let mut body = String::new();
    let mut used = fixed;
    for (listed, (category, names)) in groups.iter().enumerate() {
        let label = capitalise(category);
        let shown: Vec<&str> = names.iter().take(TIER0_NAMES_PER_CATEGORY).copied().collect();
        let more = names.len().saturating_sub(TIER0_NAMES_PER_CATEGORY);
        let more_text = if more > 0 { format!(" (+{more} more)") } else { String::new() };
        let full = format!("- {label}: {}{more_text} ({})\n", shown.join(", "), names.len());
        let short = format!("- {label} ({})\n", names.len());
        let remaining = groups.len() - listed - 1;
        let tail = if remaining > 0 { format!("- (+{remaining} more categories)\n") } else { String::new() };
        let tail_units = utf16_len(&tail);
        let line = [full, short].into_iter().find(|line| used + utf16_len(line) + tail_units <= max_units);
        match line {
            Some(line) => {
                used += utf16_len(&line);
                body.push_str(&line);
            }
            None => {
                let omitted = format!("- (+{} more categories)\n", groups.len() - listed);
                if used + utf16_len(&omitted) <= max_units {
                    body.push_str(&omitted);
                }
                break;
            }
        }
    }
    let text = format!("{TIER0_HEADER}{body}{TIER0_FOOTER}");
    debug_assert!(estimate_tokens(&text) <= budget.max_tokens());
    text
}

fn capitalise(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// A Tier 1 candidate: id, relevance and its summary line.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub id: String,
    pub relevance: f32,
    pub summary: String,
}

/// A Tier 1 entry as emitted.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tier1Entry {
    pub id: String,
    pub relevance: f32,
    pub summary_text: String,
}

/// A Tier 2 entry as emitted.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tier2Entry {
    pub id: String,
    pub full_text: String,
}

/// Token counts per tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenEstimate {
    pub tier0_tokens: usize,
    pub tier1_tokens: usize,
    pub tier2_tokens: usize,
    pub total_tokens: usize,
}

const TIER1_HEADER: &str = "\nRelevant capabilities:\n";
const TIER2_HEADER: &str = "\n--- Detailed Capability Reference ---\n";
const ABRIDGED: &str = "…";
const TRUNCATED: &str = "\n[truncated to fit the token budget]\n";
/// A summary cut to fewer units than this is left out rather than shown as a stub.
const MIN_SUMMARY_UNITS: usize = 48;

/// Renders Tier 1 lines; returns the entries kept and the rendered block.
///
/// Candidates are taken in order (callers pass them best first, already
/// filtered by minimum relevance and cut to top-k). A line that does not fit is
/// shortened; one that cannot be shortened usefully is skipped, and later,
/// shorter lines still get their chance.
pub fn assemble_tier1(candidates: &[Candidate], budget: TokenBudget) -> (Vec<Tier1Entry>, String) {
    let max_units = budget.max_units();
    let header_units = utf16_len(TIER1_HEADER);
    if candidates.is_empty() || header_units >= max_units {
        return (Vec::new(), String::new());
    }
    let mut used = header_units;
    let mut block = TIER1_HEADER.to_string();
    let mut entries = Vec::new();
    for candidate in candidates {
        let prefix = format!("{}. ", entries.len() + 1);
        let fixed = utf16_len(&prefix) + 1; // prefix and newline
        if used + fixed >= max_units {
            break;
        }
        let room = max_units - used - fixed;
        let summary = cut_to_units(&candidate.summary, room, ABRIDGED);
        if utf16_len(&summary) < MIN_SUMMARY_UNITS.min(utf16_len(&candidate.summary)) {
            continue;
        }
        used += fixed + utf16_len(&summary);
        block.push_str(&format!("{prefix}{summary}\n"));
        entries.push(Tier1Entry { id: candidate.id.clone(), relevance: candidate.relevance, summary_text: summary });
    }
    if entries.is_empty() {
        return (Vec::new(), String::new());
    }
    debug_assert!(estimate_tokens(&block) <= budget.max_tokens());
    (entries, block)
}

/// A truncated Tier 2 text keeps at least this many units of its own text
/// while other entries share the budget; below that, the lowest-ranked entry
/// is left out so the ones above it keep useful room.
const MIN_DETAIL_UNITS: usize = 48;

/// Renders Tier 2 details; texts that do not all fit whole share the budget.
///
/// Each entry (its separator and text) is allotted a share of the units left
/// after the header by [`share_units`]: entries smaller than an even share
/// stay whole, the others are truncated to what is left, with a marker saying
/// so. An oversized first entry therefore no longer crowds out the second
/// (the design asks for truncation, not omission). Only when a share cannot
/// keep [`MIN_DETAIL_UNITS`] of a text is the last entry left out and the
/// shares drawn again; a single entry keeps whatever fits, as before.
pub fn assemble_tier2<I: AsRef<str>, T: AsRef<str>>(
    details: &[(I, T)],
    budget: TokenBudget,
) -> (Vec<Tier2Entry>, String) {
    const SEPARATOR: &str = "\n";
    let max_units = budget.max_units();
    let header_units = utf16_len(TIER2_HEADER);
    if details.is_empty() || header_units >= max_units {
        return (Vec::new(), String::new());
    }
    let room = max_units - header_units;
    let separator_units = utf16_len(SEPARATOR);
    let costs: Vec<usize> = details.iter().map(|(_, text)| separator_units + utf16_len(text.as_ref())).collect();
    let mut kept = details.len();
    let bodies = loop {
        let shares = share_units(&costs[..kept], room);
        let bodies: Vec<String> = details[..kept]
            .iter()
            .zip(&shares)
            .map(|((_, text), &share)| cut_to_units(text.as_ref(), share.saturating_sub(separator_units), TRUNCATED))
            .collect();
        // Within its share (separator included), and whole or keeping enough of its own text.
        let useful = |body: &String, text: &str, share: usize| {
            let own_units = utf16_len(body).saturating_sub(utf16_len(TRUNCATED));
            separator_units + utf16_len(body) <= share
                && (body.as_str() == text
                    || (!body.is_empty() && body != TRUNCATED && (kept == 1 || own_units >= MIN_DETAIL_UNITS)))
        };
        if bodies
            .iter()
            .zip(&details[..kept])
            .zip(&shares)
            .all(|((body, (_, text)), &share)| useful(body, text.as_ref(), share))
        {
            break bodies;
        }
        kept -= 1;
        if kept == 0 {
            return (Vec::new(), String::new());
        }
    };
    let mut block = TIER2_HEADER.to_string();
    let mut entries = Vec::with_capacity(bodies.len());
    for ((id, _), body) in details.iter().zip(bodies) {
        block.push_str(SEPARATOR);
        block.push_str(&body);
        entries.push(Tier2Entry { id: id.as_ref().to_string(), full_text: body });
    }
    debug_assert!(estimate_tokens(&block) <= budget.max_tokens());
    (entries, block)
}

/// Splits `room` units among entries that would take `costs` units whole,
/// in the same order: an entry that fits in an even share of what is left
/// gets its whole cost (smallest first), the rest split the remainder evenly,
/// the higher-ranked (earlier) ones taking the odd units. No share exceeds its
/// cost, and the shares never sum to more than `room`.
fn share_units(costs: &[usize], room: usize) -> Vec<usize> {
    let mut shares = vec![0; costs.len()];
    let mut by_cost: Vec<usize> = (0..costs.len()).collect();
    by_cost.sort_by_key(|&i| (costs[i], i));
    let mut left = room;
    for (placed, &i) in by_cost.iter().enumerate() {
        let even = left / (costs.len() - placed);
        if costs[i] > even {
            let mut rest: Vec<usize> = by_cost[placed..].to_vec();
            rest.sort_unstable();
            let (each, odd) = (left / rest.len(), left % rest.len());
            for (rank, &j) in rest.iter().enumerate() {
                shares[j] = each + usize::from(rank < odd);
            }
            return shares;
        }
        shares[i] = costs[i];
        left -= costs[i];
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn estimates_count_utf16_units() {
        assert_eq!(estimate_tokens("abcd"), 1);
        assert_eq!(estimate_tokens("—"), 1);
        assert_eq!(estimate_tokens("😀😀"), 1); // two surrogate pairs, 4 units
        for text in ["", "abc", "é—😀", "a\u{7f}\u{80}\u{7ff}\u{800}\u{ffff}\u{10000}\u{10ffff}"] {
            assert_eq!(utf16_len(text), text.encode_utf16().count(), "{text:?}");
        }
        assert_eq!(cut_to_units("abcdef", 4, "…"), "abc…");
        assert_eq!(cut_to_units("ab😀", 3, ""), "ab");
    }

    #[test]
    fn tier0_shortens_then_summarises_categories() {
        let names: Vec<String> = (0..60).map(|i| format!("capability-{i}")).collect();
        let members: Vec<CategoryMember> = names
            .iter()
            .enumerate()
            .map(|(i, name)| CategoryMember {
                category: ["communication", "information", "developer", "media"][i % 4],
                name,
            })
            .chain((0..30).map(|i| CategoryMember { category: ["a1", "b2", "c3", "d4", "e5", "f6"][i % 6], name: "x" }))
            .collect();
        let text = assemble_tier0(&members, TokenBudget::new(200));
        assert!(estimate_tokens(&text) <= 200, "{text}");
        assert!(text.starts_with("Available capability categories:\n- Communication: capability-0"));
        assert!(text.ends_with("Use discover_capabilities tool to get details on any capability.\n"));
        let small = assemble_tier0(&members, TokenBudget::new(40));
        assert!(estimate_tokens(&small) <= 40, "{small}");
        assert!(small.contains("more categories"), "{small}");
        assert_eq!(assemble_tier0(&members, TokenBudget::new(0)), "");
    }

    #[test]
    fn oversized_tier2_is_truncated_not_dropped() {
        let details =
            vec![("skill:big".to_string(), "x".repeat(20_000)), ("tool:small".to_string(), "small".to_string())];
        let (entries, block) = assemble_tier2(&details, TokenBudget::new(2000));
        assert_eq!(entries.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), vec!["skill:big", "tool:small"]);
        assert!(entries[0].full_text.ends_with("[truncated to fit the token budget]\n"));
        assert_eq!(entries[1].full_text, "small", "the small entry stays whole");
        assert!(estimate_tokens(&block) <= 2000);
        // The big entry takes everything the small one leaves.
        assert_eq!(estimate_tokens(&block), 2000, "{} units", utf16_len(&block));
    }

    #[test]
    fn two_oversized_tier2_entries_split_the_budget() {
        let details = [("a", "a".repeat(9_000)), ("b", "b".repeat(9_000))];
        let (entries, block) = assemble_tier2(&details, TokenBudget::new(1000));
        assert_eq!(entries.len(), 2);
        let kept: Vec<usize> = entries.iter().map(|e| e.full_text.len() - TRUNCATED.len()).collect();
        assert!(kept[0].abs_diff(kept[1]) <= 1, "{kept:?}");
        assert!(entries.iter().all(|e| e.full_text.ends_with(TRUNCATED)));
        assert!(estimate_tokens(&block) <= 1000);
    }

    #[test]
    fn a_budget_too_small_for_two_useful_details_keeps_the_first() {
        let details = [("a", "a".repeat(900)), ("b", "b".repeat(900))];
        // Room for one truncated text with some of its own words, not for two.
        let units = utf16_len(TIER2_HEADER) + 2 * (1 + utf16_len(TRUNCATED)) + MIN_DETAIL_UNITS;
        let budget = TokenBudget::new(units / CHARS_PER_TOKEN);
        let (entries, block) = assemble_tier2(&details, budget);
        assert_eq!(entries.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), vec!["a"]);
        assert!(entries[0].full_text.ends_with(TRUNCATED));
        assert!(estimate_tokens(&block) <= budget.max_tokens());
    }

    #[test]
    fn shares_keep_small_entries_whole_and_split_the_rest() {
        assert_eq!(share_units(&[10, 20], 100), vec![10, 20]);
        assert_eq!(share_units(&[500, 10], 100), vec![90, 10]);
        assert_eq!(share_units(&[500, 500], 101), vec![51, 50]);
        assert_eq!(share_units(&[500, 30, 500], 100), vec![35, 30, 35]);
        assert_eq!(share_units(&[], 100), Vec::<usize>::new());
        assert_eq!(share_units(&[5], 0), vec![0]);
    }

    #[test]
    fn tier1_skips_a_line_that_cannot_fit_and_tries_the_next() {
        let candidates = vec![
            Candidate { id: "a".into(), relevance: 0.9, summary: "a".repeat(100) },
            Candidate { id: "b".into(), relevance: 0.8, summary: "short".into() },
        ];
        let (entries, block) = assemble_tier1(&candidates, TokenBudget::new(12));
        assert_eq!(entries.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), vec!["b"]);
        assert!(estimate_tokens(&block) <= 12);
    }

    fn arb_text() -> impl Strategy<Value = String> {
        "[a-zé😀 \\n]{0,400}"
    }

    proptest! {
        #[test]
        fn utf16_len_counts_what_encode_utf16_counts(text in any::<String>()) {
            prop_assert_eq!(utf16_len(&text), text.encode_utf16().count());
        }

        #[test]
        fn utf16_len_counts_long_mixed_text(text in "[a-z é—😀\n]{0,800}") {
            // Long enough to span several chunks, with 4-byte characters across their edges.
            prop_assert_eq!(utf16_len(&text), text.encode_utf16().count());
        }

        #[test]
        fn tiers_never_exceed_their_budgets(
            names in proptest::collection::vec(("[a-z]{1,8}", "[a-z]{1,12}"), 0..60),
            summaries in proptest::collection::vec(arb_text(), 0..8),
            details in proptest::collection::vec(arb_text(), 0..3),
            b0 in 0usize..300, b1 in 0usize..300, b2 in 0usize..300,
        ) {
            let members: Vec<CategoryMember> = names.iter().map(|(c, n)| CategoryMember { category: c, name: n }).collect();
            let tier0 = assemble_tier0(&members, TokenBudget::new(b0));
            prop_assert!(estimate_tokens(&tier0) <= b0);
            let candidates: Vec<Candidate> = summaries.iter().enumerate()
                .map(|(i, s)| Candidate { id: i.to_string(), relevance: 1.0, summary: s.clone() }).collect();
            let (_, tier1) = assemble_tier1(&candidates, TokenBudget::new(b1));
            prop_assert!(estimate_tokens(&tier1) <= b1);
            let details: Vec<(String, String)> = details.into_iter().enumerate().map(|(i, d)| (i.to_string(), d)).collect();
            let (_, tier2) = assemble_tier2(&details, TokenBudget::new(b2));
            prop_assert!(estimate_tokens(&tier2) <= b2);
            let rendered = format!("{tier0}{tier1}{tier2}");
            prop_assert!(estimate_tokens(&rendered) <= b0 + b1 + b2);
        }

        #[test]
        fn shares_never_exceed_the_room_or_a_cost(
            costs in proptest::collection::vec(0usize..5_000, 0..6),
            room in 0usize..10_000,
        ) {
            let shares = share_units(&costs, room);
            prop_assert_eq!(shares.len(), costs.len());
            prop_assert!(shares.iter().sum::<usize>() <= room);
            prop_assert!(shares.iter().zip(&costs).all(|(share, cost)| share <= cost));
            if costs.iter().sum::<usize>() <= room {
                prop_assert_eq!(&shares, &costs);
            } else {
                // Nothing is left unused when something had to be cut.
                prop_assert_eq!(shares.iter().sum::<usize>(), room);
            }
        }

        #[test]
        fn tier2_holds_its_budget_and_truncates_rather_than_omits(
            details in proptest::collection::vec(("[a-zé😀 \n]{0,40}", 0usize..12_000), 0..4),
            budget in 0usize..3_000,
        ) {
            let details: Vec<(String, String)> = details
                .into_iter()
                .enumerate()
                .map(|(i, (words, padding))| (i.to_string(), format!("{words}{}", "x".repeat(padding))))
                .collect();
            let budget = TokenBudget::new(budget);
            let (entries, block) = assemble_tier2(&details, budget);
            prop_assert!(estimate_tokens(&block) <= budget.max_tokens());
            // The entries kept are the first ones, in order, each whole or a truncated prefix.
            for (entry, (id, text)) in entries.iter().zip(&details) {
                prop_assert_eq!(&entry.id, id);
                let whole = entry.full_text == *text;
                let prefix = entry.full_text.strip_suffix(TRUNCATED).is_some_and(|kept| text.starts_with(kept));
                prop_assert!(whole || prefix, "{:?}", entry.full_text);
            }
            // With room for every entry to keep some of its text, none is left out.
            let each = 1 + utf16_len(TRUNCATED) + MIN_DETAIL_UNITS + 1;
            if budget.max_units() >= utf16_len(TIER2_HEADER) + details.len() * each {
                prop_assert_eq!(entries.len(), details.len());
            }
        }
    }
}

//! HTML building blocks: escaping, the page frame, sparklines, and the small
//! formatting rules every page shares.
//!
//! Every text that did not come from this module goes through [`escape`] (or
//! [`Html::text`]) on its way into a page: a capability named `<script>` is
//! shown as text. Attribute values are escaped the same way and always quoted.

use std::fmt::Write as _;

/// Escapes `text` for HTML text and double- or single-quoted attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    escape_into(&mut out, text);
    out
}

/// [`escape`], appended to `out`.
pub fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters other than tab and newlines have no business in a page.
            c if c.is_control() && !matches!(c, '\n' | '\r' | '\t') => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
}

/// Percent-encodes `text` for a URL's path segment or query value.
pub fn url_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// A page under construction: markup is pushed as is, text escaped.
#[derive(Default)]
pub struct Html {
    out: String,
}

impl Html {
    pub fn with_capacity(bytes: usize) -> Html {
        Html { out: String::with_capacity(bytes) }
    }

    /// Appends markup written in this module or the pages (never outside text).
    pub fn raw(&mut self, markup: &str) -> &mut Html {
        self.out.push_str(markup);
        self
    }

    /// Appends `text`, escaped.
    pub fn text(&mut self, text: &str) -> &mut Html {
        escape_into(&mut self.out, text);
        self
    }

    /// Appends `<tag class="class">text</tag>`, the text escaped.
    pub fn element(&mut self, tag: &str, class: &str, text: &str) -> &mut Html {
        if class.is_empty() {
            let _ = write!(self.out, "<{tag}>");
        } else {
            let _ = write!(self.out, "<{tag} class=\"{class}\">");
        }
        escape_into(&mut self.out, text);
        let _ = write!(self.out, "</{tag}>");
        self
    }

    /// Appends a formatted value that holds no outside text (numbers, fixed words).
    pub fn fmt(&mut self, args: std::fmt::Arguments<'_>) -> &mut Html {
        let _ = self.out.write_fmt(args);
        self
    }

    pub fn len(&self) -> usize {
        self.out.len()
    }

    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// The console's pages, in the order of the navigation bar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nav {
    Approvals,
    Kpis,
    Capabilities,
    Sources,
    Playground,
}

impl Nav {
    const ALL: [Nav; 5] = [Nav::Approvals, Nav::Kpis, Nav::Capabilities, Nav::Sources, Nav::Playground];

    pub fn path(self) -> &'static str {
        match self {
            Nav::Approvals => "/approvals",
            Nav::Kpis => "/kpis",
            Nav::Capabilities => "/capabilities",
            Nav::Sources => "/sources",
            Nav::Playground => "/playground",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Nav::Approvals => "Approvals",
            Nav::Kpis => "KPIs and alerts",
            Nav::Capabilities => "Capabilities",
            Nav::Sources => "Sources",
            Nav::Playground => "Discovery playground",
        }
    }

    /// The live events that make this page fetch its content again
    /// (`data-live` on `<main>`, read by `console.js`); empty: not live.
    pub fn live_topics(self) -> &'static str {
        match self {
            Nav::Approvals => "dispatch approval",
            Nav::Kpis => "kpi alert",
            Nav::Capabilities => "dispatch catalog",
            Nav::Sources => "sources catalog",
            Nav::Playground => "",
        }
    }
}

/// Wraps a page's content in the document: head (the CSRF token in a meta
/// tag, the stylesheet and script from `/static/`), the navigation with
/// `active` marked, and `<main>` holding `content`.
pub fn document(active: Nav, csrf: &str, content: &str) -> String {
    let mut page = Html::with_capacity(content.len() + 1024);
    page.raw("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">")
        .raw("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">")
        .raw("<meta name=\"csrf-token\" content=\"")
        .text(csrf)
        .raw("\"><title>")
        .text(active.title())
        .raw(" · capdex</title><link rel=\"stylesheet\" href=\"/static/console.css\">")
        .raw("<script src=\"/static/console.js\" defer></script></head><body><header><span class=\"brand\">capdex</span><nav>");
    for nav in Nav::ALL {
        let current = if nav == active { " aria-current=\"page\"" } else { "" };
        page.fmt(format_args!("<a href=\"{}\"{current}>{}</a>", nav.path(), nav.title()));
    }
    page.raw("</nav><span id=\"live\" class=\"live\" title=\"live updates\"></span></header>")
        .fmt(format_args!(
            "<main id=\"content\" data-live=\"{}\" data-path=\"{}\">",
            active.live_topics(),
            active.path()
        ))
        .raw(content)
        .raw("</main></body></html>\n");
    page.finish()
}

/// An inline SVG sparkline of rates in [0, 1], oldest first; gaps where a value is `None`.
pub fn sparkline(values: &[Option<f32>]) -> String {
    const WIDTH: f32 = 120.0;
    const HEIGHT: f32 = 24.0;
    let mut svg = String::with_capacity(64 + values.len() * 12);
    let _ = write!(
        svg,
        "<svg class=\"spark\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" role=\"img\" aria-label=\"success rate over the window\">"
    );
    let step = if values.len() > 1 { WIDTH / (values.len() - 1) as f32 } else { 0.0 };
    let point = |i: usize, rate: f32| (i as f32 * step, HEIGHT - 1.0 - rate.clamp(0.0, 1.0) * (HEIGHT - 2.0));
    // Runs of consecutive values become polylines; a value alone becomes a dot.
    let mut run: Vec<(f32, f32)> = Vec::new();
    let flush = |run: &mut Vec<(f32, f32)>, svg: &mut String| {
        match run.as_slice() {
            [] => {}
            [(x, y)] => {
                let _ = write!(svg, "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"1.8\"/>");
            }
            points => {
                svg.push_str("<polyline points=\"");
                for (x, y) in points {
                    let _ = write!(svg, "{x:.1},{y:.1} ");
                }
                svg.push_str("\"/>");
            }
        }
        run.clear();
    };
    for (i, value) in values.iter().enumerate() {
        match value.filter(|v| v.is_finite()) {
            Some(rate) => run.push(point(i, rate)),
            None => flush(&mut run, &mut svg),
        }
    }
    flush(&mut run, &mut svg);
    svg.push_str("</svg>");
    svg
}

/// A rate in [0, 1] as a percentage with one decimal.
pub fn percent(rate: f32) -> String {
    if rate.is_finite() {
        format!("{:.1}%", rate * 100.0)
    } else {
        "–".to_string()
    }
}

/// A duration in milliseconds, short: `850 ms`, `12.4 s`, `3 min`, `2 h`, `4 d`.
pub fn duration(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms} ms"),
        1_000..=59_999 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{} min", ms / 60_000),
        3_600_000..=86_399_999 => format!("{} h", ms / 3_600_000),
        _ => format!("{} d", ms / 86_400_000),
    }
}

/// `at_ms` relative to `now_ms`: `5 s ago`, `in 3 min`, `now`.
pub fn relative(at_ms: u64, now_ms: u64) -> String {
    if at_ms.abs_diff(now_ms) < 1_000 {
        "now".to_string()
    } else if at_ms < now_ms {
        format!("{} ago", duration(now_ms - at_ms))
    } else {
        format!("in {}", duration(at_ms - now_ms))
    }
}

/// A latency in milliseconds, or `–` when there is none.
pub fn millis(value: Option<f64>) -> String {
    match value {
        Some(ms) if ms.is_finite() && ms < 10.0 => format!("{ms:.2} ms"),
        Some(ms) if ms.is_finite() => format!("{ms:.0} ms"),
        _ => "–".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn markup_in_text_stays_text() {
        assert_eq!(escape("<script>alert('x')</script>"), "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;");
        assert_eq!(escape("a \"b\" & c"), "a &quot;b&quot; &amp; c");
        assert_eq!(escape("bell\u{7}"), "bell\u{fffd}");
    }

    #[test]
    fn the_document_marks_the_current_page_and_escapes_its_token() {
        let page = document(Nav::Kpis, "t\"<", "<p>x</p>");
        assert!(page.contains("<a href=\"/kpis\" aria-current=\"page\">KPIs and alerts</a>"));
        assert!(page.contains("content=\"t&quot;&lt;\""));
        assert!(page.contains("data-live=\"kpi alert\""));
        assert!(page.ends_with("<p>x</p></main></body></html>\n"));
    }

    #[test]
    fn a_sparkline_breaks_at_empty_slices() {
        let svg = sparkline(&[Some(1.0), Some(0.5), None, Some(0.0), Some(0.2), None, Some(1.0)]);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 1, "a value alone is a dot");
        assert!(sparkline(&[None, None]).ends_with("</svg>"));
        assert!(!sparkline(&[Some(f32::NAN)]).contains("polyline"));
    }

    #[test]
    fn durations_and_times_read_short() {
        assert_eq!(duration(850), "850 ms");
        assert_eq!(duration(12_400), "12.4 s");
        assert_eq!(duration(180_000), "3 min");
        assert_eq!(relative(1_000, 6_000), "5.0 s ago");
        assert_eq!(relative(200_000, 20_000), "in 3 min");
        assert_eq!(relative(5_000, 5_400), "now");
        assert_eq!(percent(0.9876), "98.8%");
        assert_eq!(millis(None), "–");
        assert_eq!(millis(Some(1.234)), "1.23 ms");
        assert_eq!(url_encode("tool:a b/c"), "tool%3Aa%20b%2Fc");
    }

    proptest! {
        /// Whatever the text, escaping leaves no character that opens markup or closes an attribute.
        #[test]
        fn escaped_text_never_opens_markup(text in any::<String>()) {
            let escaped = escape(&text);
            prop_assert!(!escaped.contains('<') && !escaped.contains('>'));
            prop_assert!(!escaped.contains('"') && !escaped.contains('\''));
            prop_assert!(escaped.split('&').skip(1).all(|rest| ["amp;", "lt;", "gt;", "quot;", "#39;"].iter().any(|e| rest.starts_with(e))));
        }
    }
}

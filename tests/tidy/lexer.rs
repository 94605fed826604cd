//! A small Rust lexer for the tidy checks: comments vanish, literals become
//! one token each, so code inside a string or a comment never counts and code
//! after a string on the same line always does.
//!
//! It knows line, block (nested) and doc comments; string, byte-string,
//! C-string and raw-string literals (`r#"…"#`); char and byte literals, told
//! apart from lifetimes; raw identifiers (`r#type`); and `::` as one token.

/// One token and the line it starts on.
#[derive(Clone, Debug, PartialEq)]
pub struct Token {
    pub kind: Kind,
    pub line: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// An identifier or keyword (`r#type` is `type`).
    Ident(String),
    /// A string literal's text between its quotes, escapes left as written.
    Str(String),
    /// `::`, or any other single punctuation character.
    Punct(String),
    /// A number, a char or byte literal, or a lifetime.
    Other,
}

impl Token {
    pub fn is_punct(&self, text: &str) -> bool {
        matches!(&self.kind, Kind::Punct(p) if p == text)
    }

    pub fn ident(&self) -> Option<&str> {
        match &self.kind {
            Kind::Ident(name) => Some(name),
            _ => None,
        }
    }

    pub fn is_ident(&self, text: &str) -> bool {
        self.ident() == Some(text)
    }
}

fn is_ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The tokens of `text`, comments dropped.
pub fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut lexer = Lexer { chars: &chars, at: 0, line: 1, out: Vec::new() };
    lexer.run();
    lexer.out
}

struct Lexer<'a> {
    chars: &'a [char],
    at: usize,
    line: usize,
    out: Vec<Token>,
}

impl Lexer<'_> {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    /// Moves one character on, counting lines.
    fn bump(&mut self) {
        if self.peek(0) == Some('\n') {
            self.line += 1;
        }
        self.at += 1;
    }

    fn push(&mut self, kind: Kind, line: usize) {
        self.out.push(Token { kind, line });
    }

    fn run(&mut self) {
        while let Some(c) = self.peek(0) {
            let line = self.line;
            match c {
                c if c.is_whitespace() => self.bump(),
                '/' if self.peek(1) == Some('/') => {
                    while self.peek(0).is_some_and(|c| c != '\n') {
                        self.bump();
                    }
                }
                '/' if self.peek(1) == Some('*') => self.block_comment(),
                '"' => {
                    let text = self.quoted();
                    self.push(Kind::Str(text), line);
                }
                '\'' => {
                    self.char_or_lifetime();
                    self.push(Kind::Other, line);
                }
                c if c.is_ascii_digit() => {
                    while self.peek(0).is_some_and(|c| {
                        is_ident_char(c) || (c == '.' && self.peek(1).is_some_and(|d| d.is_ascii_digit()))
                    }) {
                        self.bump();
                    }
                    self.push(Kind::Other, line);
                }
                c if is_ident_start(c) => self.word(line),
                ':' if self.peek(1) == Some(':') => {
                    self.bump();
                    self.bump();
                    self.push(Kind::Punct("::".into()), line);
                }
                c => {
                    self.bump();
                    self.push(Kind::Punct(c.to_string()), line);
                }
            }
        }
    }

    fn block_comment(&mut self) {
        let mut depth = 0usize;
        while let Some(c) = self.peek(0) {
            if c == '/' && self.peek(1) == Some('*') {
                depth += 1;
                self.bump();
            } else if c == '*' && self.peek(1) == Some('/') {
                depth -= 1;
                self.bump();
                if depth == 0 {
                    self.bump();
                    return;
                }
            }
            self.bump();
        }
    }

    /// A `"…"` literal with escapes, from its opening quote; returns its text.
    fn quoted(&mut self) -> String {
        self.bump();
        let mut text = String::new();
        while let Some(c) = self.peek(0) {
            self.bump();
            match c {
                '\\' => {
                    text.push(c);
                    if let Some(escaped) = self.peek(0) {
                        text.push(escaped);
                        self.bump();
                    }
                }
                '"' => break,
                c => text.push(c),
            }
        }
        text
    }

    /// A raw string from its `#`s or opening quote: `r#"…"#`.
    fn raw(&mut self) -> String {
        let mut hashes = 0;
        while self.peek(0) == Some('#') {
            hashes += 1;
            self.bump();
        }
        self.bump(); // the opening quote
        let mut text = String::new();
        while let Some(c) = self.peek(0) {
            if c == '"' && (1..=hashes).all(|i| self.peek(i) == Some('#')) {
                for _ in 0..=hashes {
                    self.bump();
                }
                break;
            }
            text.push(c);
            self.bump();
        }
        text
    }

    /// `'a'`, `'\n'`, `'\u{1F600}'`, or the lifetime `'a`.
    fn char_or_lifetime(&mut self) {
        self.bump();
        if self.peek(0) == Some('\\') {
            self.bump();
            self.bump();
            while self.peek(0).is_some_and(|c| c != '\'' && c != '\n') {
                self.bump();
            }
            self.bump();
        } else if self.peek(1) == Some('\'') {
            self.bump();
            self.bump();
        } else {
            while self.peek(0).is_some_and(is_ident_char) {
                self.bump();
            }
        }
    }

    /// An identifier, or the prefix of a literal (`b"…"`, `r#"…"#`, `b'x'`, `r#ident`).
    fn word(&mut self, line: usize) {
        let start = self.at;
        while self.peek(0).is_some_and(is_ident_char) {
            self.bump();
        }
        let word: String = self.chars[start..self.at].iter().collect();
        let next = self.peek(0);
        let raw_quote = || {
            let mut i = 0;
            while self.peek(i) == Some('#') {
                i += 1;
            }
            self.peek(i) == Some('"')
        };
        match (word.as_str(), next) {
            ("b" | "c", Some('"')) => {
                let text = self.quoted();
                self.push(Kind::Str(text), line);
            }
            ("r" | "br" | "cr", Some('"' | '#')) if raw_quote() => {
                let text = self.raw();
                self.push(Kind::Str(text), line);
            }
            ("r", Some('#')) if self.peek(1).is_some_and(is_ident_start) => {
                self.bump();
                let start = self.at;
                while self.peek(0).is_some_and(is_ident_char) {
                    self.bump();
                }
                let name: String = self.chars[start..self.at].iter().collect();
                self.push(Kind::Ident(name), line);
            }
            ("b", Some('\'')) => {
                self.char_or_lifetime();
                self.push(Kind::Other, line);
            }
            _ => self.push(Kind::Ident(word), line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(text: &str) -> Vec<String> {
        tokens(text).into_iter().filter_map(|t| t.ident().map(str::to_string)).collect()
    }

    fn strings(text: &str) -> Vec<String> {
        tokens(text)
            .into_iter()
            .filter_map(|t| match t.kind {
                Kind::Str(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn comments_of_every_kind_vanish() {
        assert_eq!(idents("a // sled::open\n/// tokio\n//! nats\nb"), ["a", "b"]);
        assert_eq!(idents("a /* one /* nested */ still */ b"), ["a", "b"]);
        assert_eq!(idents("/** doc */ c /*! inner */"), ["c"]);
    }

    #[test]
    fn literals_are_one_token_and_code_after_them_counts() {
        assert_eq!(idents(r#"let u = "nats://x // not a comment"; sled::open(p)"#), ["let", "u", "sled", "open", "p"]);
        assert_eq!(strings(r###"f("a\"b", b"c", r"d\", r##"e"#f"##)"###), [r#"a\"b"#, "c", r"d\", r##"e"#f"##]);
        assert_eq!(idents(r##"x = r#"tokio::spawn"#; y"##), ["x", "y"]);
    }

    #[test]
    fn chars_and_lifetimes_are_told_apart() {
        assert_eq!(
            idents(r"let q = '\''; let c = '{'; fn f<'a>(x: &'a str) {} b'x'"),
            ["let", "q", "let", "c", "fn", "f", "x", "str"]
        );
        assert_eq!(idents("let s = '\"'; tokio::x"), ["let", "s", "tokio", "x"]);
    }

    #[test]
    fn raw_identifiers_and_lines() {
        let tokens = tokens("r#type\n\n  sled");
        assert_eq!(tokens[0], Token { kind: Kind::Ident("type".into()), line: 1 });
        assert_eq!(tokens[1], Token { kind: Kind::Ident("sled".into()), line: 3 });
    }
}

//! Maps SQL DDL (PostgreSQL and SQLite dialects) into a [`SourceGraph`].
//!
//! A small hand-written tokenizer (comments, `'strings'`, `"quoted"`, `[bracketed]` and
//! `` `backquoted` `` identifiers, psql `\` meta-commands) feeds a parser that reads
//! `CREATE TABLE` (columns, inline and table `PRIMARY KEY` / `REFERENCES` / `FOREIGN KEY`)
//! and `ALTER TABLE ... ADD [CONSTRAINT n] FOREIGN KEY | PRIMARY KEY`; every other
//! statement is skipped. Each table becomes an `entity_type` with a field per column and a
//! `select_<table>` capability that queries and produces those columns; each foreign key a
//! `RESOLVES_TO` edge between the two tables and between the two columns.

use super::model::{EdgeKind, GraphBuilder, NodeKind, SourceGraph, SourceKind};
use super::MapError;
use std::collections::BTreeMap;

/// Weight of a RESOLVES_TO edge declared by a foreign key: certain, but below a seed's own 1.0.
pub const FOREIGN_KEY_WEIGHT: f32 = 0.9;

/// One parsed table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    pub name: String,
    pub columns: Vec<Column>,
    pub primary_key: Vec<String>,
    pub foreign_keys: Vec<ForeignKey>,
}

/// One column of a table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Column {
    pub name: String,
    pub data_type: String,
    pub not_null: bool,
}

/// `columns` reference `table(ref_columns)`.
#[derive(Clone, Debug, PartialEq)]
pub struct ForeignKey {
    pub columns: Vec<String>,
    pub table: String,
    pub ref_columns: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Word(String),
    Quoted(String),
    Literal,
    Punct(char),
}

#[derive(Clone, Debug)]
struct Spanned {
    token: Token,
    line: usize,
}

fn tokenize(text: &str) -> Result<Vec<Spanned>, MapError> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let (mut at, mut line, mut line_start) = (0usize, 1usize, true);
    let error = |line: usize, problem: &str| MapError::Sql { line, problem: problem.to_string() };
    while at < chars.len() {
        let c = chars[at];
        if c == '\n' {
            line += 1;
            line_start = true;
            at += 1;
            continue;
        }
        if c.is_whitespace() {
            at += 1;
            continue;
        }
        if line_start && c == '\\' {
            while at < chars.len() && chars[at] != '\n' {
                at += 1;
            }
            continue;
        }
        line_start = false;
        if c == '-' && chars.get(at + 1) == Some(&'-') {
            while at < chars.len() && chars[at] != '\n' {
                at += 1;
            }
            continue;
        }
        if c == '/' && chars.get(at + 1) == Some(&'*') {
            let start_line = line;
            at += 2;
            loop {
                match chars.get(at) {
                    None => return Err(error(start_line, "unterminated /* comment")),
                    Some('*') if chars.get(at + 1) == Some(&'/') => {
                        at += 2;
                        break;
                    }
                    Some('\n') => line += 1,
                    _ => {}
                }
                at += 1;
            }
            continue;
        }
        let closing = match c {
            '\'' => Some('\''),
            '"' => Some('"'),
            '`' => Some('`'),
            '[' => Some(']'),
            _ => None,
        };
        if let Some(close) = closing {
            let start_line = line;
            let mut value = String::new();
            at += 1;
            loop {
                match chars.get(at) {
                    None => return Err(error(start_line, "unterminated quoted text")),
                    Some(&next) if next == close => {
                        // A doubled quote is an escaped quote.
                        if close != ']' && chars.get(at + 1) == Some(&close) {
                            value.push(close);
                            at += 2;
                            continue;
                        }
                        at += 1;
                        break;
                    }
                    Some(&next) => {
                        if next == '\n' {
                            line += 1;
                        }
                        value.push(next);
                        at += 1;
                    }
                }
            }
            let token = if c == '\'' { Token::Literal } else { Token::Quoted(value) };
            tokens.push(Spanned { token, line: start_line });
            continue;
        }
        if c.is_alphanumeric() || c == '_' || c == '$' {
            let start = at;
            while at < chars.len() && (chars[at].is_alphanumeric() || chars[at] == '_' || chars[at] == '$') {
                at += 1;
            }
            tokens.push(Spanned { token: Token::Word(chars[start..at].iter().collect()), line });
            continue;
        }
        tokens.push(Spanned { token: Token::Punct(c), line });
        at += 1;
    }
    Ok(tokens)
}

/// Parses DDL text into its tables, in order of appearance.
pub fn parse_tables(text: &str) -> Result<Vec<Table>, MapError> {
    let tokens = tokenize(text)?;
    let mut tables: Vec<Table> = Vec::new();
    for statement in tokens.split(|spanned| spanned.token == Token::Punct(';')) {
        let mut cursor = Cursor { tokens: statement, at: 0 };
        if cursor.keyword("CREATE") {
            cursor.keyword("TEMP");
            cursor.keyword("TEMPORARY");
            cursor.keyword("UNLOGGED");
            if !cursor.keyword("TABLE") {
                continue;
            }
            if cursor.keyword("IF") {
                cursor.keyword("NOT");
                cursor.keyword("EXISTS");
            }
            let name = cursor.qualified_name().ok_or_else(|| cursor.error("expected a table name"))?;
            if !cursor.punct('(') {
                // CREATE TABLE ... AS SELECT: no column list to read.
                continue;
            }
            let mut table = Table { name: name.clone(), ..Table::default() };
            for item in cursor.items()? {
                parse_item(&mut Cursor { tokens: item, at: 0 }, &mut table)?;
            }
            tables.retain(|existing| existing.name != name);
            tables.push(table);
        } else if cursor.keyword("ALTER") && cursor.keyword("TABLE") {
            cursor.keyword("ONLY");
            let Some(name) = cursor.qualified_name() else { continue };
            if !cursor.keyword("ADD") {
                continue;
            }
            let Some(table) = tables.iter_mut().find(|table| table.name == name) else { continue };
            if cursor.keyword("CONSTRAINT") {
                cursor.name();
            }
            table_constraint(&mut cursor, table)?;
        }
    }
    Ok(tables)
}

fn parse_item(cursor: &mut Cursor<'_>, table: &mut Table) -> Result<(), MapError> {
    if cursor.keyword("CONSTRAINT") {
        cursor.name();
        return table_constraint(cursor, table);
    }
    if cursor.peek_keyword("PRIMARY")
        || cursor.peek_keyword("FOREIGN")
        || cursor.peek_keyword("UNIQUE")
        || cursor.peek_keyword("CHECK")
    {
        return table_constraint(cursor, table);
    }
    let name = cursor.name().ok_or_else(|| cursor.error("expected a column name"))?;
    let mut column = Column { name: name.clone(), ..Column::default() };
    let mut type_words = Vec::new();
    while let Some(token) = cursor.peek() {
        match token {
            Token::Word(word) if !is_constraint_word(word) => {
                type_words.push(word.clone());
                cursor.at += 1;
            }
            Token::Punct('(') => {
                cursor.skip_group();
            }
            _ => break,
        }
    }
    column.data_type = type_words.join(" ");
    while cursor.peek().is_some() {
        if cursor.keyword("NOT") && cursor.keyword("NULL") {
            column.not_null = true;
        } else if cursor.keyword("PRIMARY") && cursor.keyword("KEY") {
            table.primary_key = vec![name.clone()];
            column.not_null = true;
        } else if cursor.keyword("REFERENCES") {
            let target = cursor.qualified_name().ok_or_else(|| cursor.error("expected a referenced table"))?;
            let ref_columns = if cursor.punct('(') { cursor.name_list()? } else { Vec::new() };
            table.foreign_keys.push(ForeignKey { columns: vec![name.clone()], table: target, ref_columns });
        } else if matches!(cursor.peek(), Some(Token::Punct('('))) {
            cursor.skip_group();
        } else {
            cursor.at += 1;
        }
    }
    table.columns.push(column);
    Ok(())
}

fn table_constraint(cursor: &mut Cursor<'_>, table: &mut Table) -> Result<(), MapError> {
    if cursor.keyword("PRIMARY") && cursor.keyword("KEY") {
        if !cursor.punct('(') {
            return Err(cursor.error("expected ( after PRIMARY KEY"));
        }
        table.primary_key = cursor.name_list()?;
    } else if cursor.keyword("FOREIGN") && cursor.keyword("KEY") {
        if !cursor.punct('(') {
            return Err(cursor.error("expected ( after FOREIGN KEY"));
        }
        let columns = cursor.name_list()?;
        if !cursor.keyword("REFERENCES") {
            return Err(cursor.error("expected REFERENCES"));
        }
        let target = cursor.qualified_name().ok_or_else(|| cursor.error("expected a referenced table"))?;
        let ref_columns = if cursor.punct('(') { cursor.name_list()? } else { Vec::new() };
        table.foreign_keys.push(ForeignKey { columns, table: target, ref_columns });
    }
    Ok(())
}

fn is_constraint_word(word: &str) -> bool {
    const WORDS: [&str; 12] = [
        "NOT",
        "NULL",
        "PRIMARY",
        "REFERENCES",
        "DEFAULT",
        "UNIQUE",
        "CHECK",
        "CONSTRAINT",
        "COLLATE",
        "GENERATED",
        "AUTOINCREMENT",
        "IDENTITY",
    ];
    WORDS.iter().any(|keyword| keyword.eq_ignore_ascii_case(word))
}

struct Cursor<'a> {
    tokens: &'a [Spanned],
    at: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at).map(|spanned| &spanned.token)
    }

    fn error(&self, problem: &str) -> MapError {
        let line = self.tokens.get(self.at).or(self.tokens.last()).map_or(0, |spanned| spanned.line);
        MapError::Sql { line, problem: problem.to_string() }
    }

    fn peek_keyword(&self, keyword: &str) -> bool {
        matches!(self.peek(), Some(Token::Word(word)) if word.eq_ignore_ascii_case(keyword))
    }

    fn keyword(&mut self, keyword: &str) -> bool {
        let found = self.peek_keyword(keyword);
        if found {
            self.at += 1;
        }
        found
    }

    fn punct(&mut self, punct: char) -> bool {
        let found = self.peek() == Some(&Token::Punct(punct));
        if found {
            self.at += 1;
        }
        found
    }

    fn name(&mut self) -> Option<String> {
        let name = match self.peek()? {
            Token::Word(word) | Token::Quoted(word) => word.clone(),
            _ => return None,
        };
        self.at += 1;
        Some(name)
    }

    /// Reads `a.b.c` and returns the last part.
    fn qualified_name(&mut self) -> Option<String> {
        let mut name = self.name()?;
        while self.punct('.') {
            name = self.name()?;
        }
        Some(name)
    }

    /// Reads `a, b)` after an opening parenthesis.
    fn name_list(&mut self) -> Result<Vec<String>, MapError> {
        let mut names = Vec::new();
        loop {
            let name = self.name().ok_or_else(|| self.error("expected a column name"))?;
            // Skip ordering and collation words in index-style lists.
            while matches!(self.peek(), Some(Token::Word(_))) {
                self.at += 1;
            }
            names.push(name);
            if self.punct(')') {
                return Ok(names);
            }
            if !self.punct(',') {
                return Err(self.error("expected , or )"));
            }
        }
    }

    fn skip_group(&mut self) {
        let mut depth = 0usize;
        while let Some(token) = self.peek().cloned() {
            self.at += 1;
            match token {
                Token::Punct('(') => depth += 1,
                Token::Punct(')') => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        return;
                    }
                }
                _ => {}
            }
        }
    }

    /// Splits the body of a parenthesised list at top-level commas, consuming the `)`.
    fn items(&mut self) -> Result<Vec<&[Spanned]>, MapError> {
        let mut items = Vec::new();
        let (mut depth, mut start) = (0usize, self.at);
        while let Some(spanned) = self.tokens.get(self.at) {
            match spanned.token {
                Token::Punct('(') => depth += 1,
                Token::Punct(')') if depth == 0 => {
                    if self.at > start {
                        items.push(&self.tokens[start..self.at]);
                    }
                    self.at += 1;
                    return Ok(items);
                }
                Token::Punct(')') => depth -= 1,
                Token::Punct(',') if depth == 0 => {
                    items.push(&self.tokens[start..self.at]);
                    start = self.at + 1;
                }
                _ => {}
            }
            self.at += 1;
        }
        Err(self.error("unclosed ( in CREATE TABLE"))
    }
}

/// Maps DDL text.
pub fn map(source_id: &str, text: &str) -> Result<SourceGraph, MapError> {
    let tables = parse_tables(text)?;
    let mut builder = GraphBuilder::new(source_id, source_id);
    let source_node = builder.source_node();
    let mut column_ids: BTreeMap<(String, String), String> = BTreeMap::new();
    for table in &tables {
        let entity_id =
            builder.node(&table.name, NodeKind::EntityType, &table.name, &format!("table {}", table.name), None);
        let entity_key = builder.key(&table.name);
        builder.edge(&source_node, &entity_id, EdgeKind::HasEntity);
        let capability_name = format!("select_{}", table.name);
        let capability_doc = format!(
            "Select rows from table {} filtered on any of its columns: {}",
            table.name,
            table.columns.iter().map(|column| column.name.as_str()).collect::<Vec<_>>().join(", ")
        );
        let capability_id =
            builder.node(&capability_name, NodeKind::Capability, &capability_name, &capability_doc, None);
        builder.edge(&source_node, &capability_id, EdgeKind::Exposes);
        for column in &table.columns {
            let mut doc = column.data_type.clone();
            if table.primary_key.contains(&column.name) {
                doc.push_str(", primary key");
            }
            let field_id = builder.node(
                &format!("{}.{}", table.name, column.name),
                NodeKind::Field,
                &column.name,
                doc.trim(),
                Some(&entity_key),
            );
            builder.edge(&entity_id, &field_id, EdgeKind::HasField);
            builder.edge(&capability_id, &field_id, EdgeKind::SupportsQuery);
            builder.edge(&capability_id, &field_id, EdgeKind::Produces);
            column_ids.insert((table.name.clone(), column.name.clone()), field_id);
        }
        let capability_key = builder.key(&capability_name);
        builder.recipe(&capability_name, vec![capability_key.clone()], &capability_doc);
        builder.recipe(&table.name, vec![capability_key], &format!("read {}", table.name));
    }
    for table in &tables {
        for foreign_key in &table.foreign_keys {
            let target_id = super::model::node_id(&builder.key(&foreign_key.table), NodeKind::EntityType);
            if !builder.has_node(&target_id) {
                continue;
            }
            let evidence = format!(
                "foreign_key={}({})->{}({})",
                table.name,
                foreign_key.columns.join(","),
                foreign_key.table,
                foreign_key.ref_columns.join(",")
            );
            let source_id = super::model::node_id(&builder.key(&table.name), NodeKind::EntityType);
            builder.weighted_edge(
                &source_id,
                &target_id,
                EdgeKind::ResolvesTo,
                FOREIGN_KEY_WEIGHT,
                vec![evidence.clone()],
            );
            for (column, ref_column) in foreign_key.columns.iter().zip(&foreign_key.ref_columns) {
                let from = column_ids.get(&(table.name.clone(), column.clone()));
                let to = column_ids.get(&(foreign_key.table.clone(), ref_column.clone()));
                if let (Some(from), Some(to)) = (from, to) {
                    builder.weighted_edge(from, to, EdgeKind::ResolvesTo, FOREIGN_KEY_WEIGHT, vec![evidence.clone()]);
                }
            }
        }
    }
    Ok(builder.finish(SourceKind::Sql))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_with_alter_table_foreign_keys() {
        let text = "/* header */\n\\c chinook;\nCREATE TABLE public.album\n(\n album_id INT NOT NULL,\n title VARCHAR(160) NOT NULL,\n artist_id INT NOT NULL,\n CONSTRAINT album_pkey PRIMARY KEY (album_id)\n);\nCREATE TABLE artist (artist_id INT PRIMARY KEY, name TEXT DEFAULT 'a;b');\nALTER TABLE album ADD CONSTRAINT fk FOREIGN KEY (artist_id) REFERENCES artist (artist_id) ON DELETE NO ACTION;\nINSERT INTO artist VALUES (1, 'x');";
        let tables = parse_tables(text).unwrap();
        assert_eq!(tables.len(), 2);
        assert_eq!(tables[0].name, "album");
        assert_eq!(tables[0].primary_key, ["album_id"]);
        assert_eq!(tables[0].columns[1], Column { name: "title".into(), data_type: "VARCHAR".into(), not_null: true });
        assert_eq!(
            tables[0].foreign_keys,
            [ForeignKey {
                columns: vec!["artist_id".into()],
                table: "artist".into(),
                ref_columns: vec!["artist_id".into()]
            }]
        );
        assert_eq!(tables[1].primary_key, ["artist_id"]);
        assert_eq!(tables[1].columns.len(), 2);
    }

    #[test]
    fn sqlite_brackets_and_inline_foreign_keys() {
        let text = "CREATE TABLE [Album] ( [AlbumId] INTEGER NOT NULL, [ArtistId] INTEGER NOT NULL REFERENCES \"Artist\"(ArtistId),\n CONSTRAINT [PK_Album] PRIMARY KEY ([AlbumId]),\n FOREIGN KEY ([ArtistId]) REFERENCES [Artist] ([ArtistId]) ON DELETE NO ACTION );\nCREATE TABLE Artist (ArtistId INTEGER);";
        let graph = map("db", text).unwrap();
        assert_eq!(graph.count_nodes(NodeKind::EntityType), 2);
        assert_eq!(graph.count_nodes(NodeKind::Capability), 2);
        // One table-level and one column-level RESOLVES_TO, deduplicated across the two declarations.
        assert_eq!(graph.count_edges(EdgeKind::ResolvesTo), 2);
    }

    #[test]
    fn broken_ddl_is_a_typed_error_with_a_line() {
        assert!(matches!(parse_tables("CREATE TABLE t (\n a INT"), Err(MapError::Sql { line: 2, .. })));
        assert!(matches!(parse_tables("/* open"), Err(MapError::Sql { line: 1, .. })));
        assert!(matches!(parse_tables("CREATE TABLE t (a INT, FOREIGN KEY a)"), Err(MapError::Sql { .. })));
        assert_eq!(parse_tables("SELECT 1; DROP TABLE x;").unwrap(), []);
    }
}

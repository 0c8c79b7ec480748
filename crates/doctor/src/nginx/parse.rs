//! nginx's configuration grammar: directives, blocks, quoting, escapes and `include`.
//!
//! The tokenizer follows `ngx_conf_read_token`: `#` starts a comment only where a token could
//! start, `{` right after `$` belongs to a `${var}`, a quoted token must be followed by a
//! separator, and backslash escapes are undone the way nginx undoes them.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Blocks nested deeper than this are refused rather than recursed into.
const MAX_DEPTH: usize = 100;
/// `include` chains deeper than this are taken for a cycle.
const MAX_INCLUDE_DEPTH: usize = 32;

/// A 1-based line and column (columns count characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub column: u32,
}

/// One argument of a directive, unescaped, with where it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arg {
    /// The argument's value after nginx's unescaping.
    pub value: String,
    /// Where the argument starts.
    pub pos: Pos,
}

/// A directive: its name, arguments, optional block, and where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directive {
    /// The directive's name, e.g. `server`.
    pub name: String,
    /// Its arguments.
    pub args: Vec<Arg>,
    /// The block's directives, for block directives.
    pub block: Option<Vec<Directive>>,
    /// The file it was read from, as given (includes keep their own file).
    pub file: Arc<str>,
    /// Where its name starts.
    pub pos: Pos,
    /// `file:line` of the `include` that read its file, when it came from one.
    pub included_at: Option<Arc<str>>,
}

impl Directive {
    /// The argument values as string slices.
    pub fn arg(&self, i: usize) -> Option<&str> {
        self.args.get(i).map(|a| a.value.as_str())
    }

    /// The block's directives, or an empty slice.
    pub fn children(&self) -> &[Directive] {
        self.block.as_deref().unwrap_or(&[])
    }
}

/// What went wrong while reading a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseErrorKind {
    /// The file ended inside a directive or a block.
    #[error("unexpected end of file, expecting \";\" or \"}}\"")]
    UnexpectedEof,
    /// The file ended inside a quoted string.
    #[error("unexpected end of file inside a quoted string")]
    UnterminatedQuote,
    /// A `}` with no open block.
    #[error("unexpected \"}}\"")]
    UnexpectedClose,
    /// A `;` or `{` with no directive name before it.
    #[error("unexpected \"{0}\" with no directive name")]
    MissingName(char),
    /// A quoted token glued to the next token.
    #[error("unexpected \"{0}\" after a quoted string")]
    NeedSpace(char),
    /// Blocks nested too deep.
    #[error("blocks nested deeper than {MAX_DEPTH}")]
    TooDeep,
    /// A file could not be read.
    #[error("cannot read: {0}")]
    Io(String),
    /// `include` without exactly one argument.
    #[error("\"include\" takes exactly one argument")]
    IncludeArgs,
    /// An `include` of a file that does not exist (no glob characters).
    #[error("include \"{0}\" not found")]
    IncludeNotFound(String),
    /// An `include` pattern that glob cannot read.
    #[error("include pattern \"{0}\" is invalid: {1}")]
    IncludePattern(String, String),
    /// An `include` cycle or chain too deep.
    #[error("include nested deeper than {MAX_INCLUDE_DEPTH} (a cycle?)")]
    IncludeTooDeep,
}

/// A configuration error with the file and position it happened at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// The file being read.
    pub file: String,
    /// Where in it.
    pub pos: Pos,
    /// What went wrong.
    pub kind: ParseErrorKind,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.pos.line, self.pos.column, self.kind
        )
    }
}

impl std::error::Error for ParseError {}

#[derive(Debug)]
enum Token {
    Word(Arg),
    Semi(Pos),
    Open(Pos),
    Close(Pos),
    Eof(Pos),
}

struct Lexer<'a> {
    src: &'a [u8],
    at: usize,
    line: u32,
    column: u32,
}

impl<'a> Lexer<'a> {
    fn new(src: &'a [u8]) -> Self {
        Lexer {
            src,
            at: 0,
            line: 1,
            column: 1,
        }
    }

    fn pos(&self) -> Pos {
        Pos {
            line: self.line,
            column: self.column,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.at).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        if b == b'\n' {
            self.line += 1;
            self.column = 1;
        } else if b & 0xC0 != 0x80 {
            // Continuation bytes of a UTF-8 character do not start a new column.
            self.column += 1;
        }
        Some(b)
    }

    fn next(&mut self) -> Result<Token, (Pos, ParseErrorKind)> {
        loop {
            match self.peek() {
                None => return Ok(Token::Eof(self.pos())),
                Some(b' ' | b'\t' | b'\r' | b'\n') => {
                    self.bump();
                }
                Some(b'#') => {
                    while let Some(b) = self.bump() {
                        if b == b'\n' {
                            break;
                        }
                    }
                }
                Some(b';') => {
                    let p = self.pos();
                    self.bump();
                    return Ok(Token::Semi(p));
                }
                Some(b'{') => {
                    let p = self.pos();
                    self.bump();
                    return Ok(Token::Open(p));
                }
                Some(b'}') => {
                    let p = self.pos();
                    self.bump();
                    return Ok(Token::Close(p));
                }
                Some(q @ (b'"' | b'\'')) => return self.quoted(q).map(Token::Word),
                Some(_) => return Ok(Token::Word(self.word())),
            }
        }
    }

    /// Errors point at the opening quote, where the reader should look.
    fn quoted(&mut self, quote: u8) -> Result<Arg, (Pos, ParseErrorKind)> {
        let pos = self.pos();
        self.bump();
        let start = self.at;
        loop {
            match self.bump() {
                None => return Err((pos, ParseErrorKind::UnterminatedQuote)),
                Some(b'\\') => {
                    if self.bump().is_none() {
                        return Err((pos, ParseErrorKind::UnterminatedQuote));
                    }
                }
                Some(b) if b == quote => break,
                Some(_) => {}
            }
        }
        let raw = &self.src[start..self.at - 1];
        // nginx wants a separator after a closing quote; a ")" is swallowed as one.
        match self.peek() {
            None | Some(b' ' | b'\t' | b'\r' | b'\n' | b';' | b'{') => {}
            Some(b')') => {
                self.bump();
            }
            Some(b) => return Err((self.pos(), ParseErrorKind::NeedSpace(char::from(b)))),
        }
        Ok(Arg {
            value: unescape(raw),
            pos,
        })
    }

    fn word(&mut self) -> Arg {
        let pos = self.pos();
        let start = self.at;
        let mut after_dollar = false;
        while let Some(b) = self.peek() {
            match b {
                b'{' if after_dollar => {}
                b' ' | b'\t' | b'\r' | b'\n' | b';' | b'{' => break,
                b'\\' => {
                    self.bump();
                    if self.peek().is_none() {
                        break;
                    }
                }
                _ => {}
            }
            after_dollar = b == b'$';
            self.bump();
        }
        Arg {
            value: unescape(&self.src[start..self.at]),
            pos,
        }
    }
}

/// Undoes nginx's escapes: `\"`, `\'`, `\\`, `\t`, `\r`, `\n`; other pairs stay as written.
fn unescape(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'\\' && i + 1 < raw.len() {
            match raw[i + 1] {
                b'"' | b'\'' | b'\\' => out.push(raw[i + 1]),
                b't' => out.push(b'\t'),
                b'r' => out.push(b'\r'),
                b'n' => out.push(b'\n'),
                other => {
                    out.push(b'\\');
                    out.push(other);
                }
            }
            i += 2;
        } else {
            out.push(raw[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses one file's text without following `include`.
pub fn parse_str(src: &[u8], file: &str) -> Result<Vec<Directive>, ParseError> {
    let file: Arc<str> = Arc::from(file);
    let mut lexer = Lexer::new(src);
    // An explicit stack instead of recursion, so deep nesting cannot overflow ours.
    let mut stack: Vec<(Directive, Vec<Directive>)> = Vec::new();
    let mut current: Vec<Directive> = Vec::new();
    let mut words: Vec<Arg> = Vec::new();
    loop {
        let token = lexer.next().map_err(|(pos, kind)| ParseError {
            file: file.to_string(),
            pos,
            kind,
        })?;
        match token {
            Token::Word(arg) => words.push(arg),
            Token::Semi(pos) | Token::Open(pos) => {
                let open = matches!(token, Token::Open(_));
                if words.is_empty() {
                    return Err(ParseError {
                        file: file.to_string(),
                        pos,
                        kind: ParseErrorKind::MissingName(if open { '{' } else { ';' }),
                    });
                }
                let mut args = std::mem::take(&mut words);
                let name = args.remove(0);
                let d = Directive {
                    name: name.value,
                    args,
                    block: None,
                    file: file.clone(),
                    pos: name.pos,
                    included_at: None,
                };
                if open {
                    if stack.len() >= MAX_DEPTH {
                        return Err(ParseError {
                            file: file.to_string(),
                            pos,
                            kind: ParseErrorKind::TooDeep,
                        });
                    }
                    stack.push((d, std::mem::take(&mut current)));
                } else {
                    current.push(d);
                }
            }
            Token::Close(pos) => {
                if !words.is_empty() {
                    return Err(ParseError {
                        file: file.to_string(),
                        pos,
                        kind: ParseErrorKind::UnexpectedClose,
                    });
                }
                let Some((mut d, parent)) = stack.pop() else {
                    return Err(ParseError {
                        file: file.to_string(),
                        pos,
                        kind: ParseErrorKind::UnexpectedClose,
                    });
                };
                d.block = Some(std::mem::replace(&mut current, parent));
                current.push(d);
            }
            Token::Eof(pos) => {
                if !words.is_empty() || !stack.is_empty() {
                    return Err(ParseError {
                        file: file.to_string(),
                        pos,
                        kind: ParseErrorKind::UnexpectedEof,
                    });
                }
                return Ok(current);
            }
        }
    }
}

/// Where `include` paths point: relative ones under `prefix`, absolute ones under `root`.
#[derive(Debug, Clone)]
struct Base {
    prefix: PathBuf,
    root: Option<PathBuf>,
}

impl Base {
    fn resolve(&self, include: &str) -> PathBuf {
        let p = Path::new(include);
        match (&self.root, p.strip_prefix("/")) {
            (Some(root), Ok(rel)) => root.join(rel),
            _ => self.prefix.join(p),
        }
    }
}

/// A configuration read with [`load_lenient`]: the tree, and the includes it had to skip.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// The directives, includes expanded in place.
    pub tree: Vec<Directive>,
    /// `include`s of a file that is not there, in reading order.
    pub missing: Vec<MissingInclude>,
}

/// An `include` of a file that is not there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingInclude {
    /// Where the `include` is (kind `IncludeNotFound`).
    pub error: ParseError,
    /// `file:line` of the `include` that read the file holding it, when one did.
    pub included_at: Option<Arc<str>>,
}

/// Reads a configuration file and every file it includes, in place; a missing include is
/// an error.
pub fn load(
    path: &Path,
    prefix: Option<&Path>,
    root: Option<&Path>,
) -> Result<Vec<Directive>, ParseError> {
    let loaded = load_lenient(path, prefix, root)?;
    match loaded.missing.into_iter().next() {
        Some(m) => Err(m.error),
        None => Ok(loaded.tree),
    }
}

/// Reads a configuration file and every file it includes, in place, skipping (and listing)
/// includes of files that are not there: a config copied without a neighbour such as
/// `fastcgi_params` is still checked.
///
/// Relative `include` paths resolve against `prefix`, or the directory of `path` when none
/// is given (what `nginx -c FILE` does). Absolute ones resolve under `root` when given, so a
/// copy of another machine's `/etc/nginx` can be checked as it stands. Globs are expanded in
/// sorted order, as nginx does.
pub fn load_lenient(
    path: &Path,
    prefix: Option<&Path>,
    root: Option<&Path>,
) -> Result<Loaded, ParseError> {
    let prefix = match prefix {
        Some(p) => p.to_path_buf(),
        None => path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(".")),
    };
    let base = Base {
        prefix,
        root: root.map(Path::to_path_buf),
    };
    let mut missing = Vec::new();
    let tree = load_file(path, &base, 0, &mut missing)?;
    Ok(Loaded { tree, missing })
}

fn load_file(
    path: &Path,
    prefix: &Base,
    depth: usize,
    missing: &mut Vec<MissingInclude>,
) -> Result<Vec<Directive>, ParseError> {
    let name = path.display().to_string();
    let src = std::fs::read(path).map_err(|e| ParseError {
        file: name.clone(),
        pos: Pos { line: 0, column: 0 },
        kind: ParseErrorKind::Io(e.to_string()),
    })?;
    let tree = parse_str(&src, &name)?;
    expand(tree, prefix, depth, missing)
}

/// Marks the directives read from an included file (not those of deeper includes, which
/// already carry their own site) with the `include` that read them.
fn mark_included(dirs: &mut [Directive], site: &Arc<str>) {
    for d in dirs {
        if d.included_at.is_none() {
            d.included_at = Some(site.clone());
            if let Some(b) = d.block.as_mut() {
                mark_included(b, site);
            }
        }
    }
}

/// Marks missing includes found in an included file with the `include` that read it.
fn mark_missing(missing: &mut [MissingInclude], site: &Arc<str>) {
    for m in missing.iter_mut().filter(|m| m.included_at.is_none()) {
        m.included_at = Some(site.clone());
    }
}

fn expand(
    tree: Vec<Directive>,
    prefix: &Base,
    depth: usize,
    missing: &mut Vec<MissingInclude>,
) -> Result<Vec<Directive>, ParseError> {
    let mut out = Vec::with_capacity(tree.len());
    for mut d in tree {
        if d.name == "include" && d.block.is_none() {
            let at = |kind| ParseError {
                file: d.file.to_string(),
                pos: d.pos,
                kind,
            };
            if depth >= MAX_INCLUDE_DEPTH {
                return Err(at(ParseErrorKind::IncludeTooDeep));
            }
            let [arg] = d.args.as_slice() else {
                return Err(at(ParseErrorKind::IncludeArgs));
            };
            let target = prefix.resolve(&arg.value);
            let site: Arc<str> = Arc::from(format!("{}:{}", d.file, d.pos.line));
            let pattern = target.to_string_lossy().into_owned();
            if arg.value.contains(['*', '?', '[']) {
                let paths = glob::glob(&pattern).map_err(|e| {
                    at(ParseErrorKind::IncludePattern(
                        arg.value.clone(),
                        e.to_string(),
                    ))
                })?;
                let mut files: Vec<PathBuf> = paths
                    .filter_map(Result::ok)
                    .filter(|p| p.is_file())
                    .collect();
                files.sort();
                for f in files {
                    let before = missing.len();
                    let mut inc = load_file(&f, prefix, depth + 1, missing)?;
                    mark_included(&mut inc, &site);
                    mark_missing(&mut missing[before..], &site);
                    out.extend(inc);
                }
            } else if target.is_file() {
                let before = missing.len();
                let mut inc = load_file(&target, prefix, depth + 1, missing)?;
                mark_included(&mut inc, &site);
                mark_missing(&mut missing[before..], &site);
                out.extend(inc);
            } else {
                missing.push(MissingInclude {
                    error: at(ParseErrorKind::IncludeNotFound(arg.value.clone())),
                    included_at: None,
                });
            }
            continue;
        }
        if let Some(block) = d.block.take() {
            d.block = Some(expand(block, prefix, depth, missing)?);
        }
        out.push(d);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Vec<Directive> {
        parse_str(s.as_bytes(), "t.conf").unwrap()
    }

    #[test]
    fn directives_blocks_and_positions() {
        let t = parse("http {\n  upstream be { server a:80 resolve; }\n}\n");
        assert_eq!(t[0].name, "http");
        let up = &t[0].children()[0];
        assert_eq!((up.name.as_str(), up.arg(0)), ("upstream", Some("be")));
        let server = &up.children()[0];
        assert_eq!(
            server.pos,
            Pos {
                line: 2,
                column: 17
            }
        );
        assert_eq!(server.args[1].value, "resolve");
        assert_eq!(
            server.args[1].pos,
            Pos {
                line: 2,
                column: 29
            }
        );
    }

    #[test]
    fn quotes_escapes_comments_and_variable_braces() {
        let t = parse("a \"x y\" 'q\\'s' b\\;c #c;\n d ${host}x;\n");
        let a: Vec<_> = t[0].args.iter().map(|a| a.value.as_str()).collect();
        // nginx keeps a backslash before characters it does not unescape.
        assert_eq!(a, ["x y", "q's", "b\\;c", "d", "${host}x"]);
        let t = parse("set $x \"a#b\";");
        assert_eq!(t[0].arg(1), Some("a#b"));
    }

    #[test]
    fn if_with_quoted_condition_parses() {
        let t = parse("if ($request_method = \"POST\") { return 405; }");
        assert_eq!(t[0].name, "if");
        assert_eq!(t[0].children()[0].name, "return");
    }

    #[test]
    fn errors_name_the_position() {
        let e = parse_str(b"http {\n  a b;\n", "x.conf").unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::UnexpectedEof);
        assert_eq!(
            e.to_string(),
            "x.conf:3:1: unexpected end of file, expecting \";\" or \"}\""
        );
        let e = parse_str(b"a;\n}", "x.conf").unwrap_err();
        assert_eq!(
            (e.kind, e.pos.line, e.pos.column),
            (ParseErrorKind::UnexpectedClose, 2, 1)
        );
        let e = parse_str(b"a \"b\"c;", "x.conf").unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::NeedSpace('c'));
        let e = parse_str(b"a \"b", "x.conf").unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::UnterminatedQuote);
        let e = parse_str(b"  ;", "x.conf").unwrap_err();
        assert_eq!(
            (e.kind, e.pos.column),
            (ParseErrorKind::MissingName(';'), 3)
        );
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let src = "a{".repeat(10_000);
        let e = parse_str(src.as_bytes(), "x.conf").unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::TooDeep);
    }
}

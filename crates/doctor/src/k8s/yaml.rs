//! YAML documents as trees whose every node knows its line and column.

use std::collections::HashMap;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// Nodes (after alias expansion) above this count are refused: a guard against alias bombs.
const MAX_NODES: usize = 1_000_000;

/// A YAML value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A scalar, kept as written (Kubernetes fields are read as strings or numbers on demand).
    Str(String),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in document order.
    Map(Vec<(Node, Node)>),
}

/// A value and where it starts (1-based line and column).
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The value.
    pub value: Value,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub column: u32,
}

impl Node {
    /// The value under `key` in a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match &self.value {
            Value::Map(m) => m
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// Follows a path of mapping keys.
    pub fn path(&self, keys: &[&str]) -> Option<&Node> {
        keys.iter().try_fold(self, |n, k| n.get(k))
    }

    /// The scalar's text.
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The scalar as a number.
    pub fn as_f64(&self) -> Option<f64> {
        self.as_str()?.trim().parse().ok()
    }

    /// The sequence's items, or an empty slice.
    pub fn items(&self) -> &[Node] {
        match &self.value {
            Value::Seq(s) => s,
            _ => &[],
        }
    }

    /// The mapping's entries, or an empty slice.
    pub fn entries(&self) -> &[(Node, Node)] {
        match &self.value {
            Value::Map(m) => m,
            _ => &[],
        }
    }
}

/// One document of a stream, with the Helm template it came from when marked.
#[derive(Debug, Clone)]
pub struct Document {
    /// The document's root.
    pub root: Node,
    /// The `# Source: chart/templates/x.yaml` comment before it (Helm output).
    pub source: Option<String>,
}

/// A YAML syntax error with its position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{column}: {message}")]
pub struct YamlError {
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub column: u32,
    /// What is wrong.
    pub message: String,
}

enum Frame {
    Seq(Node, usize),
    Map(Node, usize, Option<Node>),
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    docs: Vec<Node>,
    anchors: HashMap<usize, Node>,
    nodes: usize,
    too_many: Option<(Marker, String)>,
}

fn at(value: Value, m: Marker) -> Node {
    Node {
        value,
        line: u32::try_from(m.line()).unwrap_or(u32::MAX),
        // yaml-rust2 counts columns from 0.
        column: u32::try_from(m.col() + 1).unwrap_or(u32::MAX),
    }
}

fn size(n: &Node) -> usize {
    match &n.value {
        Value::Str(_) => 1,
        Value::Seq(s) => 1 + s.iter().map(size).sum::<usize>(),
        Value::Map(m) => 1 + m.iter().map(|(k, v)| size(k) + size(v)).sum::<usize>(),
    }
}

impl Builder {
    fn push(&mut self, node: Node) {
        match self.stack.last_mut() {
            None => self.docs.push(node),
            Some(Frame::Seq(
                Node {
                    value: Value::Seq(items),
                    ..
                },
                _,
            )) => items.push(node),
            Some(Frame::Map(map, _, pending)) => match pending.take() {
                None => *pending = Some(node),
                Some(key) => {
                    if let Value::Map(entries) = &mut map.value {
                        entries.push((key, node));
                    }
                }
            },
            Some(Frame::Seq(..)) => {}
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        if self.too_many.is_some() {
            return;
        }
        self.nodes += 1;
        match ev {
            Event::Scalar(s, _, anchor, _) => {
                let n = at(Value::Str(s), mark);
                if anchor > 0 {
                    self.anchors.insert(anchor, n.clone());
                }
                self.push(n);
            }
            Event::Alias(id) => {
                let n = self
                    .anchors
                    .get(&id)
                    .cloned()
                    .unwrap_or_else(|| at(Value::Str(String::new()), mark));
                self.nodes += size(&n);
                self.push(n);
            }
            Event::SequenceStart(anchor, _) => self
                .stack
                .push(Frame::Seq(at(Value::Seq(Vec::new()), mark), anchor)),
            Event::MappingStart(anchor, _) => {
                self.stack
                    .push(Frame::Map(at(Value::Map(Vec::new()), mark), anchor, None))
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (n, anchor) = match self.stack.pop() {
                    Some(Frame::Seq(n, a) | Frame::Map(n, a, _)) => (n, a),
                    None => return,
                };
                if anchor > 0 {
                    self.anchors.insert(anchor, n.clone());
                }
                self.push(n);
            }
            _ => {}
        }
        if self.nodes > MAX_NODES {
            self.too_many = Some((
                mark,
                format!("more than {MAX_NODES} nodes after expanding aliases"),
            ));
        }
    }
}

/// Parses every document of a YAML stream (`---` separated), keeping positions.
pub fn parse_documents(src: &str) -> Result<Vec<Document>, YamlError> {
    let mut b = Builder::default();
    let mut parser = Parser::new_from_str(src);
    parser.load(&mut b, true).map_err(|e| YamlError {
        line: u32::try_from(e.marker().line()).unwrap_or(u32::MAX),
        column: u32::try_from(e.marker().col() + 1).unwrap_or(u32::MAX),
        message: e.info().to_owned(),
    })?;
    if let Some((m, message)) = b.too_many {
        return Err(YamlError {
            line: u32::try_from(m.line()).unwrap_or(u32::MAX),
            column: u32::try_from(m.col() + 1).unwrap_or(u32::MAX),
            message,
        });
    }
    let sources: Vec<(u32, &str)> = src
        .lines()
        .enumerate()
        .filter_map(|(i, l)| {
            Some((
                u32::try_from(i + 1).ok()?,
                l.strip_prefix("# Source: ")?.trim(),
            ))
        })
        .collect();
    let mut prev = 0;
    Ok(b.docs
        .into_iter()
        .map(|root| {
            let source = sources
                .iter()
                .rev()
                .find(|(l, _)| *l < root.line && *l > prev)
                .map(|(_, s)| (*s).to_owned());
            prev = root.line;
            Document { root, source }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based_and_documents_split() {
        let docs = parse_documents(
            "a: 1\nb:\n  c: [x, y]\n---\n# Source: chart/templates/d.yaml\nkind: Pod\n",
        )
        .unwrap();
        assert_eq!(docs.len(), 2);
        let a = docs[0].root.get("a").unwrap();
        assert_eq!((a.as_str(), a.line, a.column), (Some("1"), 1, 4));
        let c = docs[0].root.path(&["b", "c"]).unwrap();
        assert_eq!((c.items().len(), c.line, c.column), (2, 3, 6));
        assert_eq!(docs[0].source, None);
        assert_eq!(docs[1].source.as_deref(), Some("chart/templates/d.yaml"));
        assert_eq!(docs[1].root.get("kind").and_then(Node::as_str), Some("Pod"));
    }

    #[test]
    fn deep_nesting_and_alias_bombs_are_errors() {
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let e = parse_documents(&deep).unwrap_err();
        // The YAML parser's own recursion limit keeps the tree shallow.
        assert!(e.message.contains("recursion limit"), "{e}");
        assert_eq!(e.line, 1);
        let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 0..8 {
            let prev = if i == 0 {
                "a".to_owned()
            } else {
                format!("b{}", i - 1)
            };
            bomb.push_str(&format!("b{i}: &b{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"));
        }
        let e = parse_documents(&bomb).unwrap_err();
        assert!(e.message.contains("nodes after expanding aliases"), "{e}");
    }

    #[test]
    fn anchors_expand_and_errors_have_positions() {
        let docs = parse_documents("x: &p {path: /a}\ny: *p\n").unwrap();
        assert_eq!(
            docs[0].root.path(&["y", "path"]).and_then(Node::as_str),
            Some("/a")
        );
        let e = parse_documents("a: [1, 2\nb: 3\n").unwrap_err();
        assert!(e.line >= 1 && e.column >= 1, "{e}");
    }
}

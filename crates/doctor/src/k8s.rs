//! Kubernetes manifests (plain or Helm-rendered YAML): probes, drain and keep-alive order.

pub mod live;
mod order;
mod rules;
pub mod yaml;

use crate::finding::{Finding, Location};
use std::path::{Path, PathBuf};
use yaml::{Document, Node};

/// A manifest that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    /// A file or directory could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The file.
        file: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file is not valid YAML.
    #[error("{file}:{source}")]
    Yaml {
        /// The file.
        file: String,
        /// Where and why.
        #[source]
        source: yaml::YamlError,
    },
    /// A `--live` request could not be made.
    #[error(transparent)]
    Live(#[from] live::LiveError),
}

/// One Kubernetes object of a document, with the file it came from.
#[derive(Debug, Clone, Copy)]
pub struct Object<'a> {
    /// The file, as given.
    pub file: &'a str,
    /// The document it is in (for the Helm source).
    pub doc: &'a Document,
    /// The object's root node.
    pub root: &'a Node,
}

impl<'a> Object<'a> {
    /// `kind`, or "".
    pub fn kind(&self) -> &'a str {
        self.root.get("kind").and_then(Node::as_str).unwrap_or("")
    }

    /// `metadata.name`, or "?".
    pub fn name(&self) -> &'a str {
        self.root
            .path(&["metadata", "name"])
            .and_then(Node::as_str)
            .unwrap_or("?")
    }

    /// `metadata.namespace`.
    pub fn namespace(&self) -> Option<&'a str> {
        self.root
            .path(&["metadata", "namespace"])
            .and_then(Node::as_str)
    }

    /// A location at `node` in this object's file.
    pub fn at(&self, node: &Node) -> Location {
        Location::at(self.file, node.line, node.column)
    }

    /// " (Helm template X)" when the document came from one, else "".
    pub fn from_template(&self) -> String {
        self.doc
            .source
            .as_deref()
            .map(|s| format!(" (Helm template {s})"))
            .unwrap_or_default()
    }

    /// `Kind/name`, for messages.
    pub fn label(&self) -> String {
        format!("{}/{}", self.kind(), self.name())
    }
}

/// Files to read: the paths themselves, and `*.yaml`/`*.yml` found under directories.
pub fn manifest_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, K8sError> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            walk(p, &mut out)?;
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), K8sError> {
    let err = |source| K8sError::Read {
        file: dir.display().to_string(),
        source,
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(err)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out)?;
        } else if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(p);
        }
    }
    Ok(())
}

/// Reads every manifest under `paths` and runs every rule; `live` is a base URL to measure
/// liveness endpoints against.
pub fn check_paths(paths: &[PathBuf], live: Option<&str>) -> Result<Vec<Finding>, K8sError> {
    let mut files = Vec::new();
    for f in manifest_files(paths)? {
        let name = f.display().to_string();
        let src = std::fs::read(&f).map_err(|source| K8sError::Read {
            file: name.clone(),
            source,
        })?;
        let src = String::from_utf8_lossy(&src);
        let docs = yaml::parse_documents(&src).map_err(|source| K8sError::Yaml {
            file: name.clone(),
            source,
        })?;
        files.push((name, docs));
    }
    let mut objects = Vec::new();
    for (name, docs) in &files {
        for doc in docs {
            collect(name, doc, &doc.root, &mut objects);
        }
    }
    let mut out = Vec::new();
    for o in &objects {
        rules::check_object(o, live, &mut out)?;
    }
    rules::check_drain(&objects, &mut out);
    order::check(&objects, &mut out);
    Ok(out)
}

/// Objects of a document; a `List` contributes its items.
fn collect<'a>(file: &'a str, doc: &'a Document, root: &'a Node, out: &mut Vec<Object<'a>>) {
    let kind = root.get("kind").and_then(Node::as_str).unwrap_or("");
    if kind.ends_with("List") {
        if let Some(items) = root.get("items") {
            for item in items.items() {
                collect(file, doc, item, out);
            }
        }
        return;
    }
    out.push(Object { file, doc, root });
}

/// The pod template's metadata and spec of a workload, by kind.
pub fn pod_template<'a>(o: &Object<'a>) -> Option<(Option<&'a Node>, &'a Node)> {
    let r = o.root;
    match o.kind() {
        "Pod" => Some((r.get("metadata"), r.get("spec")?)),
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "Job"
        | "ReplicationController" => {
            let t = r.path(&["spec", "template"])?;
            Some((t.get("metadata"), t.get("spec")?))
        }
        "CronJob" => {
            let t = r.path(&["spec", "jobTemplate", "spec", "template"])?;
            Some((t.get("metadata"), t.get("spec")?))
        }
        _ => None,
    }
}

//! The resources: what a client may read without calling a tool, each a use case of the
//! workspace service like the tools. `environment://history` is the history of the workspace's
//! branch; `environment://versions/{version}` lists the files at a version (each mark is listed
//! as one, so the list changes when a mark is made); `environment://files/{version}/{path}` is a
//! file at a version, as text or, when it is not UTF-8, as a blob.

use environment_workspace::{Method, ServiceError};
use percent_encoding::percent_decode_str;
use rmcp::model::{Resource, ResourceContents, ResourceTemplate};
use serde_json::{Map, Value, json};

/// The scheme and authority of every resource.
const ROOT: &str = "environment://";

/// What reading a resource asks of the service, and how its answer becomes contents.
pub(super) struct Read {
    /// The use case.
    pub method: Method,
    /// Its arguments.
    pub args: Map<String, Value>,
}

/// The resources listed: the history, and the files at each mark (`marks` is the service's
/// answer to `marks`).
pub(super) fn listed(marks: &Value) -> Vec<Resource> {
    let mut out = vec![
        Resource::new(format!("{ROOT}history"), "history")
            .with_title("The workspace's history")
            .with_description("Newest first: who changed what and why, the op id of each version.")
            .with_mime_type("application/json"),
    ];
    for m in marks["marks"].as_array().into_iter().flatten() {
        let name = m["name"].as_str().unwrap_or_default();
        out.push(
            Resource::new(format!("{ROOT}versions/{name}"), format!("files at {name}"))
                .with_description(format!("The files at the mark {name}."))
                .with_mime_type("application/json"),
        );
    }
    out
}

/// The templates of resources not listed one by one.
pub(super) fn templates() -> Vec<ResourceTemplate> {
    vec![
        ResourceTemplate::new(format!("{ROOT}versions/{{version}}"), "files at a version")
            .with_description(
                "The files at a version: an op id or a unique prefix of 4+ hex digits, a mark, a \
                 branch or HEAD, optionally followed by ~N.",
            )
            .with_mime_type("application/json"),
        ResourceTemplate::new(
            format!("{ROOT}files/{{version}}/{{+path}}"),
            "a file at a version",
        )
        .with_description(
            "A file's content at a version: text, or a blob (base64) when it is not UTF-8.",
        ),
    ]
}

/// What reading `uri` asks of the service; an address that names no resource is invalid.
pub(super) fn read(uri: &str) -> Result<Read, ServiceError> {
    let unknown = || {
        ServiceError::invalid(format!(
            "{uri:?} is not a resource: they are {ROOT}history, {ROOT}versions/VERSION and \
             {ROOT}files/VERSION/PATH"
        ))
    };
    let rest = uri.strip_prefix(ROOT).ok_or_else(unknown)?;
    let decoded = |s: &str| {
        percent_decode_str(s)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| unknown())
    };
    let (method, args) = match rest.split_once('/') {
        None if rest == "history" => (Method::History, json!({ "limit": 100 })),
        Some(("versions", version)) if !version.is_empty() && !version.contains('/') => {
            (Method::FileList, json!({ "version": decoded(version)? }))
        }
        Some(("files", at)) => {
            let (version, path) = at.split_once('/').ok_or_else(unknown)?;
            if version.is_empty() || path.is_empty() {
                return Err(unknown());
            }
            (
                Method::FileRead,
                json!({ "version": decoded(version)?, "path": decoded(path)? }),
            )
        }
        _ => return Err(unknown()),
    };
    Ok(Read {
        method,
        args: args.as_object().cloned().unwrap_or_default(),
    })
}

/// The contents of `uri` from the service's `answer` to `method`.
pub(super) fn contents(uri: &str, method: Method, answer: &Value) -> ResourceContents {
    match (method, answer["text"].as_str(), answer["base64"].as_str()) {
        (Method::FileRead, Some(text), _) => {
            ResourceContents::text(text, uri).with_mime_type("text/plain")
        }
        (Method::FileRead, None, Some(b64)) => {
            ResourceContents::blob(b64, uri).with_mime_type("application/octet-stream")
        }
        _ => ResourceContents::text(
            serde_json::to_string_pretty(answer).unwrap_or_else(|_| answer.to_string()),
            uri,
        )
        .with_mime_type("application/json"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_name_their_use_case_or_are_refused() {
        let r = read("environment://files/good~1/src/a%20b.rs").unwrap();
        assert_eq!(r.method, Method::FileRead);
        assert_eq!(r.args["version"], "good~1");
        assert_eq!(r.args["path"], "src/a b.rs");
        assert_eq!(
            read("environment://versions/HEAD").unwrap().method,
            Method::FileList
        );
        assert_eq!(
            read("environment://history").unwrap().method,
            Method::History
        );
        for bad in [
            "environment://",
            "environment://files/HEAD",
            "environment://files//a",
            "environment://versions/",
            "environment://versions/a/b",
            "file:///etc/passwd",
            "environment://secrets",
        ] {
            assert!(read(bad).is_err(), "{bad}");
        }
    }
}

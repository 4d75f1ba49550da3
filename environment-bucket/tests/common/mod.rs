//! What the bucket's tests share: the bucket's objects seen past the store.
#![allow(dead_code)]

use std::sync::Arc;

use environment_core::Hash;
use object_store::ObjectStore;
use object_store::path::Path;

/// The bucket's objects under `root` (`s3://BUCKET/PREFIX`) as a test sees them, past the
/// store: the object store and the prefix.
pub fn raw(root: &str) -> (Arc<dyn ObjectStore>, Path) {
    let rest = root.strip_prefix("s3://").unwrap();
    let (name, prefix) = rest.split_once('/').unwrap();
    let s3 = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(name)
        .build()
        .unwrap();
    (Arc::new(s3), Path::from(prefix))
}

/// Where the blob named `hash` is kept under `prefix`.
pub fn blob_key(prefix: &Path, hash: &Hash) -> Path {
    prefix.clone().join("blobs").join(hash.to_hex())
}

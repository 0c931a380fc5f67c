//! The owner mark: what capo-rs puts on everything it creates, so that a lookup by name (the
//! only way back to a resource whose ID a lost status write forgot) finds its own resources
//! and never another owner's of the same name.
//!
//! The mark names the owner by kind, namespace and name, hashed: those are unique in one
//! management cluster, cannot collide across namespaces as `<namespace>-<name>` can, and
//! survive `clusterctl move` (which recreates the objects, so their UIDs change, and does not
//! carry their status). The hash keeps the tag within Nova's 60 characters and free of the
//! `/` and `,` Nova and Neutron refuse in a tag.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The prefix of every owner tag, and the Cinder metadata key of the mark (Cinder has no
/// tags).
pub const OWNER_KEY: &str = "capo-rs-owner";

/// Hex digits of the digest kept: 80 bits, so two owners never share a mark by chance.
const DIGEST_HEX: usize = 20;

/// The mark of one owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    digest: String,
    tag: String,
}

impl Owner {
    /// The owner `kind` `namespace`/`name` (for example an OpenStackServer's).
    pub fn new(kind: &str, namespace: &str, name: &str) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(format!("{kind}/{namespace}/{name}"));
        let digest: String = hasher
            .finalize()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect::<String>()
            .chars()
            .take(DIGEST_HEX)
            .collect();
        let tag = format!("{OWNER_KEY}-{digest}");
        Owner { digest, tag }
    }

    /// The tag on Nova, Neutron and Octavia resources: `capo-rs-owner-<digest>`.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// `tags` with the owner tag added (once).
    pub fn with_tag(&self, tags: &[String]) -> Vec<String> {
        let mut tags = tags.to_vec();
        if !self.marks(&tags) {
            tags.push(self.tag.clone());
        }
        tags
    }

    /// Whether `tags` carry this owner's tag.
    pub fn marks(&self, tags: &[String]) -> bool {
        tags.contains(&self.tag)
    }

    /// A description that carries the mark too: Neutron takes tags only after a create, and
    /// the description goes in the create itself, so a resource whose tagging failed is
    /// still known as this owner's.
    pub fn describe(&self, description: &str) -> String {
        format!("{description} ({})", self.tag)
    }

    /// Whether a Neutron resource with these tags and description is this owner's.
    pub fn owns(&self, tags: &[String], description: &str) -> bool {
        self.marks(tags) || description.contains(&self.tag)
    }

    /// The Cinder metadata that marks a volume as this owner's.
    pub fn metadata(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(OWNER_KEY.to_owned(), self.digest.clone())])
    }

    /// Whether Cinder `metadata` marks a volume as this owner's.
    pub fn marks_metadata(&self, metadata: &BTreeMap<String, String>) -> bool {
        metadata.get(OWNER_KEY) == Some(&self.digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_join_alike_across_namespaces_are_told_apart() {
        // `<namespace>-<name>` reads "a-b-c" for both.
        let one = Owner::new("OpenStackCluster", "a-b", "c");
        let other = Owner::new("OpenStackCluster", "a", "b-c");
        assert_ne!(one, other);
        assert!(!one.marks(&other.with_tag(&[])));
        assert!(!one.marks_metadata(&other.metadata()));
    }

    #[test]
    fn the_tag_is_stable_short_and_free_of_what_nova_and_neutron_refuse() {
        let owner = Owner::new("OpenStackServer", &"n".repeat(63), &"x".repeat(253));
        assert_eq!(
            owner,
            Owner::new("OpenStackServer", &"n".repeat(63), &"x".repeat(253))
        );
        assert!(owner.tag().len() <= 60, "{}", owner.tag());
        assert!(!owner.tag().contains(['/', ',']));
        assert!(owner.tag().starts_with("capo-rs-owner-"));
    }

    #[test]
    fn the_kind_is_part_of_the_owner() {
        let server = Owner::new("OpenStackServer", "ns", "demo");
        let cluster = Owner::new("OpenStackCluster", "ns", "demo");
        assert_ne!(server.tag(), cluster.tag());
    }

    #[test]
    fn the_tag_is_added_once_and_read_back() {
        let owner = Owner::new("OpenStackServer", "ns", "demo");
        let tags = owner.with_tag(&["capo".to_owned()]);
        assert_eq!(owner.with_tag(&tags), tags);
        assert!(owner.marks(&tags));
        assert!(owner.marks_metadata(&owner.metadata()));
    }

    #[test]
    fn a_description_carries_the_mark_for_what_could_not_be_tagged() {
        let owner = Owner::new("OpenStackCluster", "ns", "demo");
        let other = Owner::new("OpenStackCluster", "ns", "demo2");
        let described = owner.describe("Cluster API managed group");
        assert!(described.starts_with("Cluster API managed group ("));
        assert!(owner.owns(&[], &described));
        assert!(!other.owns(&[], &described));
        assert!(owner.owns(&owner.with_tag(&[]), ""));
        assert!(!owner.owns(&[], "Cluster API managed group"));
    }
}

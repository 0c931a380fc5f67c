//! Kubernetes events (`events.k8s.io/v1`): an event seen again within six minutes becomes a
//! `series` (its count and last time patched onto the first) instead of another object, as
//! client-go's and kube-runtime's recorders do.
//!
//! kube-runtime's `Recorder` keeps every event it sent, whole, for six minutes, and forgets
//! old ones only when it sends another: at a thousand clusters coming up that was megabytes
//! held long after. This one remembers, per distinct event, its name and count (about a
//! hundred bytes), forgets them after the same six minutes, and never holds more than
//! `REMEMBERED`. Unlike those two, it tells events apart by their note too, so a series
//! never shows an old message for a new one (our notes say how long a member has waited).

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, PoisonError};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use serde_json::json;

/// How long an event is remembered for a series (client-go's and kube-rs's six minutes).
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);
/// The most distinct events remembered at once; the oldest go first.
const REMEMBERED: usize = 4096;

/// Who reports: `reportingController` and `reportingInstance`.
#[derive(Clone, Debug)]
pub struct Reporter {
    /// `reportingController`; also the event name's prefix when the object has no name.
    pub controller: String,
    /// `reportingInstance` (the pod's name); `None` reports the controller's name instead.
    pub instance: Option<String>,
}

/// One event to publish.
#[derive(Clone, Copy, Debug)]
pub struct EventSpec<'a> {
    /// `type`: Normal or Warning.
    pub type_: EventType,
    /// `reason`: what happened, in CamelCase (`MemberCreated`, or an error's condition reason).
    pub reason: &'a str,
    /// `action`: what we were doing (`Reconcile`, `Delete`, ...).
    pub action: &'a str,
    /// `note`: the human-readable message; events with another note are not one series.
    pub note: &'a str,
}

/// What was sent for one distinct event.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Sent {
    namespace: String,
    name: String,
    count: i32,
    last: Timestamp,
}

/// What to send: a new Event, or the next count of a series.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Send {
    Create,
    Series {
        namespace: String,
        name: String,
        count: i32,
    },
}

/// The memory of recent events: pure, time passed in.
#[derive(Debug, Default)]
struct Correlator {
    sent: HashMap<u64, Sent>,
}

impl Correlator {
    fn decide(&mut self, key: u64, now: Timestamp) -> Send {
        self.sent.retain(|_, sent| sent.last + SERIES_WINDOW > now);
        match self.sent.get(&key) {
            Some(sent) => Send::Series {
                namespace: sent.namespace.clone(),
                name: sent.name.clone(),
                count: sent.count + 1,
            },
            None => Send::Create,
        }
    }

    fn remember(&mut self, key: u64, sent: Sent) {
        if !self.sent.contains_key(&key) && self.sent.len() >= REMEMBERED {
            let oldest = self
                .sent
                .iter()
                .min_by_key(|(_, sent)| sent.last)
                .map(|(key, _)| *key);
            if let Some(oldest) = oldest {
                self.sent.remove(&oldest);
            }
        }
        self.sent.insert(key, sent);
    }

    fn forget(&mut self, key: u64) {
        self.sent.remove(&key);
    }
}

/// Publishes events; cheap to share.
pub struct Recorder {
    client: kube::Client,
    reporter: Reporter,
    correlator: Mutex<Correlator>,
}

impl Recorder {
    /// A recorder writing Events with `client`, as `reporter`, with no events remembered yet.
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Recorder {
            client,
            reporter,
            correlator: Mutex::default(),
        }
    }

    /// Sends `event` about `regarding`: a new Event, or the next count of the same one sent
    /// within the last six minutes.
    pub async fn publish(
        &self,
        event: EventSpec<'_>,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let key = event_key(&event, regarding);
        let now = Timestamp::now();
        let send = self.correlator().decide(key, now);
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let sent = match send {
            Send::Series {
                namespace,
                name,
                count,
            } => match self.continue_series(&namespace, &name, count, now).await {
                Ok(()) => Sent {
                    namespace,
                    name,
                    count,
                    last: now,
                },
                // The API server dropped it already (events live an hour): start again.
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    self.correlator().forget(key);
                    self.create(&namespace, event, regarding, now).await?
                }
                Err(error) => return Err(error),
            },
            Send::Create => self.create(&namespace, event, regarding, now).await?,
        };
        self.correlator().remember(key, sent);
        Ok(())
    }

    fn correlator(&self) -> std::sync::MutexGuard<'_, Correlator> {
        self.correlator
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    async fn create(
        &self,
        namespace: &str,
        event: EventSpec<'_>,
        regarding: &ObjectReference,
        now: Timestamp,
    ) -> Result<Sent, kube::Error> {
        let name = format!(
            "{}.{:x}",
            regarding
                .name
                .as_deref()
                .unwrap_or(&self.reporter.controller),
            now.as_nanosecond()
        );
        let object = K8sEvent {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.to_owned()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(type_name(event.type_).to_owned()),
            reason: Some(event.reason.to_owned()),
            action: Some(event.action.to_owned()),
            note: Some(event.note.to_owned()),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            ..K8sEvent::default()
        };
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        api.create(&PostParams::default(), &object).await?;
        Ok(Sent {
            namespace: namespace.to_owned(),
            name,
            count: 1,
            last: now,
        })
    }

    async fn continue_series(
        &self,
        namespace: &str,
        name: &str,
        count: i32,
        now: Timestamp,
    ) -> Result<(), kube::Error> {
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        let patch = json!({"series": {"count": count, "lastObservedTime": MicroTime(now)}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }
}

fn type_name(type_: EventType) -> &'static str {
    match type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

/// What makes two events the same: type, reason, action, note and the object regarded.
fn event_key(event: &EventSpec<'_>, regarding: &ObjectReference) -> u64 {
    let mut hasher = DefaultHasher::new();
    (
        type_name(event.type_),
        event.reason,
        event.action,
        event.note,
    )
        .hash(&mut hasher);
    (
        &regarding.api_version,
        &regarding.kind,
        &regarding.namespace,
        &regarding.name,
        &regarding.uid,
    )
        .hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(name: &str, count: i32, last: Timestamp) -> Sent {
        Sent {
            namespace: "ns".into(),
            name: name.into(),
            count,
            last,
        }
    }

    #[test]
    fn the_same_event_within_six_minutes_continues_its_series() {
        let mut correlator = Correlator::default();
        let t0 = Timestamp::UNIX_EPOCH;
        assert_eq!(correlator.decide(1, t0), Send::Create);
        correlator.remember(1, sent("e1", 1, t0));
        let soon = t0 + SignedDuration::from_mins(5);
        assert_eq!(
            correlator.decide(1, soon),
            Send::Series {
                namespace: "ns".into(),
                name: "e1".into(),
                count: 2
            }
        );
        correlator.remember(1, sent("e1", 2, soon));
        // Six minutes after the last one, not the first: the series goes on.
        let later = soon + SignedDuration::from_mins(5);
        assert!(matches!(
            correlator.decide(1, later),
            Send::Series { count: 3, .. }
        ));
        // A quiet six minutes: a new event, and nothing remembered.
        let quiet = later + SignedDuration::from_mins(7);
        assert_eq!(correlator.decide(1, quiet), Send::Create);
        assert!(correlator.sent.is_empty());
    }

    #[test]
    fn another_note_is_another_event() {
        let regarding = ObjectReference {
            kind: Some("OpenStackMachine".into()),
            namespace: Some("ns".into()),
            name: Some("m1".into()),
            ..ObjectReference::default()
        };
        let event = |note| EventSpec {
            type_: EventType::Warning,
            reason: "MemberStuck",
            action: "Reconcile",
            note,
        };
        assert_eq!(
            event_key(&event("stuck for 600s"), &regarding),
            event_key(&event("stuck for 600s"), &regarding)
        );
        assert_ne!(
            event_key(&event("stuck for 600s"), &regarding),
            event_key(&event("stuck for 900s"), &regarding)
        );
        let other = ObjectReference {
            name: Some("m2".into()),
            ..regarding.clone()
        };
        assert_ne!(
            event_key(&event("x"), &regarding),
            event_key(&event("x"), &other)
        );
    }

    #[test]
    fn memory_is_bounded_and_the_oldest_go_first() {
        let mut correlator = Correlator::default();
        let t0 = Timestamp::UNIX_EPOCH;
        for key in 0..REMEMBERED as u64 {
            let at = t0 + SignedDuration::from_millis(key as i64);
            correlator.remember(key, sent("e", 1, at));
        }
        let now = t0 + SignedDuration::from_secs(10);
        correlator.remember(u64::MAX, sent("newest", 1, now));
        assert_eq!(correlator.sent.len(), REMEMBERED);
        assert!(!correlator.sent.contains_key(&0), "the oldest was dropped");
        assert!(correlator.sent.contains_key(&u64::MAX));
    }
}

//! Metadata-only answers, as kube-apiserver gives them to `Accept:
//! application/json;as=PartialObjectMetadata(List);g=meta.k8s.io;v=v1`: what kube-rs's
//! `Api<PartialObjectMeta<K>>` (and a `watcher` over it) asks for. Objects come back as
//! `PartialObjectMetadata`, lists as `PartialObjectMetadataList`, watch events (bookmarks
//! too) carry `PartialObjectMetadata`; selectors, pages and resourceVersions are those of
//! the full objects.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    Api, DeleteParams, ListParams, PartialObjectMeta, Patch, PatchParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

use super::{Widget, pp, start, start_with, widget, within};
use capo_sim::kube::output::{Output, negotiate, partial, partial_list};
use capo_sim::kube::{KubeSim, KubeSimConfig};

const META: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
const META_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

fn assert_partial<K: std::fmt::Debug>(object: &PartialObjectMeta<K>) {
    let types = object.types.as_ref().expect("kind and apiVersion");
    assert_eq!(
        (types.kind.as_str(), types.api_version.as_str()),
        ("PartialObjectMetadata", "meta.k8s.io/v1"),
        "{object:?}"
    );
}

async fn configmap(client: &Client, name: &str, app: &str) -> ConfigMap {
    let configmaps: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.metadata.labels = Some([("app".to_owned(), app.to_owned())].into());
    cm.data = Some(BTreeMap::from([(
        "secret-ish".to_owned(),
        "payload".to_owned(),
    )]));
    configmaps.create(&pp(), &cm).await.expect("create")
}

/// A GET through plain HTTP with an `Accept` header: (code, body).
async fn raw(sim: &KubeSim, path: &str, accept: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .get(format!("{}{path}", sim.url()))
        .header("Accept", accept)
        .send()
        .await
        .expect("the simulator answers");
    let code = response.status().as_u16();
    let body = response.json().await.expect("a JSON body");
    (code, body)
}

#[tokio::test]
async fn metadata_get_and_list_leave_the_data_out() {
    let (sim, client) = start().await;
    let a = configmap(&client, "a", "web").await;
    let b = configmap(&client, "b", "web").await;
    configmap(&client, "c", "db").await;
    let metas: Api<PartialObjectMeta<ConfigMap>> = Api::default_namespaced(client.clone());

    let got = metas.get("a").await.expect("get");
    assert_partial(&got);
    assert_eq!(got.name_any(), "a");
    assert_eq!(got.labels().get("app").map(String::as_str), Some("web"));
    assert_eq!(got.resource_version(), a.resource_version());
    assert_eq!(got.uid(), a.uid());

    let listed = metas
        .list(&ListParams::default().labels("app=web"))
        .await
        .expect("list");
    assert_eq!(
        (
            listed.types.kind.as_str(),
            listed.types.api_version.as_str()
        ),
        ("PartialObjectMetadataList", "meta.k8s.io/v1")
    );
    assert!(listed.metadata.resource_version.is_some());
    let seen: Vec<(String, Option<String>)> = listed
        .items
        .iter()
        .map(|o| (o.name_any(), o.resource_version()))
        .collect();
    assert_eq!(
        seen,
        [
            ("a".to_owned(), a.resource_version()),
            ("b".to_owned(), b.resource_version())
        ]
    );
    listed.items.iter().for_each(assert_partial);

    // Pages as for full objects.
    let first = metas
        .list(&ListParams::default().limit(1))
        .await
        .expect("page 1");
    let token = first.metadata.continue_.clone().expect("a continue token");
    assert_eq!(first.metadata.remaining_item_count, Some(2));
    let second = metas
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .expect("page 2");
    assert_eq!(super::names(&first.items), ["a"]);
    assert_eq!(super::names(&second.items), ["b"]);
    assert_eq!(
        first.metadata.resource_version,
        second.metadata.resource_version
    );

    // On the wire: metadata and nothing else.
    let object_path = "/api/v1/namespaces/default/configmaps/a";
    let (code, body) = raw(&sim, object_path, META).await;
    assert_eq!(code, 200);
    assert_eq!(
        body.as_object()
            .map(|o| o.keys().cloned().collect::<Vec<_>>()),
        Some(vec![
            "apiVersion".to_owned(),
            "kind".to_owned(),
            "metadata".to_owned()
        ]),
        "{body}"
    );
    let list_path = "/api/v1/namespaces/default/configmaps?labelSelector=app%3Dweb";
    let (code, body) = raw(&sim, list_path, &format!("{META_LIST},application/json")).await;
    assert_eq!(code, 200);
    assert_eq!(body["kind"], "PartialObjectMetadataList");
    assert!(
        body["items"]
            .as_array()
            .is_some_and(|items| items.len() == 2)
    );
    assert!(body["items"][0].get("data").is_none(), "{body}");
    let (_, full) = raw(&sim, list_path, &format!("application/json,{META_LIST}")).await;
    assert_eq!(full["kind"], "ConfigMapList", "the first clause wins");

    // The wrong one of the pair is 406, worded as the API server words it.
    let (code, body) = raw(&sim, list_path, META).await;
    assert_eq!((code, &body["reason"]), (406, &json!("NotAcceptable")));
    assert_eq!(
        body["message"],
        "you requested PartialObjectMetadata, but the requested object is a list (*core.ConfigMapList)"
    );
    let (code, body) = raw(&sim, object_path, META_LIST).await;
    assert_eq!(code, 406);
    assert_eq!(
        body["message"],
        "you requested PartialObjectMetadataList, but the requested object is not a list (*core.ConfigMap)"
    );
    let (code, body) = raw(&sim, object_path, "text/html").await;
    assert_eq!(code, 406);
    assert_eq!(
        body["message"],
        "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf"
    );
}

/// Drives a watcher until `done` says its state is reached, checking every object is
/// metadata only.
async fn follow<K: Resource + std::fmt::Debug>(
    stream: &mut (
             impl futures::Stream<Item = Result<watcher::Event<PartialObjectMeta<K>>, watcher::Error>>
             + Unpin
         ),
    seen: &mut BTreeMap<String, Option<String>>,
    done: impl Fn(&BTreeMap<String, Option<String>>) -> bool,
) {
    while !done(seen) {
        match stream.try_next().await.expect("watcher ok") {
            Some(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                assert_partial(&o);
                seen.insert(o.name_any(), o.resource_version());
            }
            Some(watcher::Event::Delete(o)) => {
                assert_partial(&o);
                seen.remove(&o.name_any());
            }
            Some(watcher::Event::Init) => seen.clear(),
            Some(watcher::Event::InitDone) => {}
            None => panic!("the watcher ended"),
        }
    }
}

#[tokio::test]
async fn a_metadata_watcher_follows_the_server() {
    let (_sim, client) = start().await;
    configmap(&client, "a", "web").await;
    configmap(&client, "b", "web").await;
    configmap(&client, "c", "db").await;
    let configmaps: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let metas: Api<PartialObjectMeta<ConfigMap>> = Api::default_namespaced(client.clone());
    for config in [
        watcher::Config::default(),
        watcher::Config::default().streaming_lists(),
    ] {
        let current = configmaps.get("a").await.expect("get");
        let mut stream = watcher(metas.clone(), config.labels("app=web")).boxed();
        let mut seen = BTreeMap::new();
        within(
            "the initial list",
            follow(&mut stream, &mut seen, |s| s.len() == 2),
        )
        .await;
        assert_eq!(seen.get("a"), Some(&current.resource_version()));

        let patched = configmaps
            .patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"more": "x"}})),
            )
            .await
            .expect("patch");
        within(
            "the change",
            follow(&mut stream, &mut seen, |s| {
                s.get("a") == Some(&patched.resource_version())
            }),
        )
        .await;
        configmaps
            .delete("b", &DeleteParams::default())
            .await
            .expect("delete");
        within(
            "the deletion",
            follow(&mut stream, &mut seen, |s| !s.contains_key("b")),
        )
        .await;
        configmap(&client, "b", "web").await;
    }
}

#[tokio::test]
async fn metadata_watch_events_and_bookmarks_are_partial_object_metadata() {
    let config = KubeSimConfig {
        bookmark_interval: Duration::from_millis(50),
        ..KubeSimConfig::default()
    };
    let (_sim, client) = start_with(config).await;
    configmap(&client, "a", "web").await;
    let metas: Api<PartialObjectMeta<ConfigMap>> = Api::default_namespaced(client.clone());
    let mut stream = metas
        .watch(&WatchParams::default(), "0")
        .await
        .expect("watch")
        .boxed();
    match within("ADDED", stream.next()).await {
        Some(Ok(WatchEvent::Added(o))) => {
            assert_partial(&o);
            assert_eq!(o.name_any(), "a");
        }
        other => panic!("expected ADDED, got {other:?}"),
    }
    match within("a bookmark", stream.next()).await {
        Some(Ok(WatchEvent::Bookmark(b))) => {
            assert_eq!(
                (b.types.kind.as_str(), b.types.api_version.as_str()),
                ("PartialObjectMetadata", "meta.k8s.io/v1")
            );
            assert!(!b.metadata.resource_version.is_empty());
        }
        other => panic!("expected BOOKMARK, got {other:?}"),
    }
}

#[tokio::test]
async fn custom_resources_answer_metadata_too() {
    let (sim, client) = start().await;
    let widgets: Api<Widget> = Api::default_namespaced(client.clone());
    let mut labelled = widget("w1", "small");
    labelled.metadata.labels = Some([("tier".to_owned(), "gold".to_owned())].into());
    let w1 = widgets.create(&pp(), &labelled).await.expect("create");
    widgets
        .create(&pp(), &widget("w2", "large"))
        .await
        .expect("create");
    let metas: Api<PartialObjectMeta<Widget>> = Api::default_namespaced(client.clone());

    let got = metas.get("w1").await.expect("get");
    assert_partial(&got);
    assert_eq!(got.resource_version(), w1.resource_version());
    assert_eq!(got.meta().generation, Some(1));
    assert_eq!(got.labels().get("tier").map(String::as_str), Some("gold"));

    let listed = metas
        .list(&ListParams::default().labels("tier=gold"))
        .await
        .expect("list");
    assert_eq!(listed.types.kind, "PartialObjectMetadataList");
    assert_eq!(super::names(&listed.items), ["w1"]);
    listed.items.iter().for_each(assert_partial);

    let path = "/apis/example.com/v1/namespaces/default/widgets";
    let (code, body) = raw(&sim, &format!("{path}/w1"), META).await;
    assert_eq!(code, 200);
    assert!(
        body.get("spec").is_none() && body.get("status").is_none(),
        "{body}"
    );
    let (code, body) = raw(&sim, path, META).await;
    assert_eq!(code, 406);
    assert_eq!(
        body["message"],
        "you requested PartialObjectMetadata, but the requested object is a list (*unstructured.UnstructuredList)"
    );

    let mut stream = watcher(metas.clone(), watcher::Config::default()).boxed();
    let mut seen = BTreeMap::new();
    within(
        "the initial list",
        follow(&mut stream, &mut seen, |s| s.len() == 2),
    )
    .await;
    let patched = widgets
        .patch(
            "w2",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"color": "red"}})),
        )
        .await
        .expect("patch");
    assert_eq!(patched.meta().generation, Some(2));
    within(
        "the change",
        follow(&mut stream, &mut seen, |s| {
            s.get("w2") == Some(&patched.resource_version())
        }),
    )
    .await;
}

fn accepted(accept: &str) -> Output {
    negotiate(Some(accept), false).expect("acceptable")
}

#[test]
fn the_first_accept_clause_the_server_honours_wins() {
    assert_eq!(accepted(META), Output::Metadata("v1"));
    assert_eq!(accepted(META_LIST), Output::MetadataList("v1"));
    assert_eq!(
        accepted(&format!("{META_LIST},application/json")),
        Output::MetadataList("v1")
    );
    assert_eq!(
        accepted("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1"),
        Output::Metadata("v1beta1")
    );
    let kubectl_get = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    assert_eq!(accepted(kubectl_get), Output::Table);
    // Without group and version it is no transformation the server knows: the next clause.
    assert_eq!(
        accepted("application/json;as=PartialObjectMetadata, application/json"),
        Output::Object
    );
    // Quality first, then concrete types before wildcards.
    assert_eq!(
        accepted(&format!("application/json;q=0.5, {META}")),
        Output::Metadata("v1")
    );
    assert_eq!(accepted(&format!("*/*, {META}")), Output::Metadata("v1"));
    assert_eq!(accepted("*/*"), Output::Object);
    assert_eq!(
        accepted("application/vnd.kubernetes.protobuf, application/json"),
        Output::Object
    );
    assert_eq!(negotiate(None, true).expect("no header"), Output::Object);
}

#[test]
fn an_accept_header_with_nothing_to_honour_is_406() {
    for accept in [
        "text/html",
        "application/json;as=PartialObjectMetadata",
        "application/json;as=Widget;g=meta.k8s.io;v=v1",
        "application/vnd.kubernetes.protobuf;as=Table;g=meta.k8s.io;v=v1",
        "application/json;q=0",
    ] {
        let error = negotiate(Some(accept), false).expect_err(accept);
        assert_eq!(
            (error.code, error.reason),
            (406, "NotAcceptable"),
            "{accept}"
        );
        assert_eq!(
            error.message,
            "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf"
        );
    }
    // Custom resources have no protobuf form; their metadata has.
    assert!(negotiate(Some("application/vnd.kubernetes.protobuf"), true).is_err());
    let protobuf_meta =
        "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
    assert_eq!(
        negotiate(Some(protobuf_meta), true).expect("acceptable"),
        Output::Metadata("v1")
    );
}

#[test]
fn partial_object_metadata_keeps_the_whole_metadata_and_nothing_else() {
    let object = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "b"},
                        "metadata": {"name": "c", "resourceVersion": "7", "labels": {"x": "y"}}});
    assert_eq!(
        partial(&object, "v1"),
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
               "metadata": {"name": "c", "resourceVersion": "7", "labels": {"x": "y"}}})
    );
    let list = partial_list(
        &[object],
        json!({"resourceVersion": "9", "continue": "t"}),
        "v1",
    );
    assert_eq!(list["kind"], "PartialObjectMetadataList");
    assert_eq!(
        list["metadata"],
        json!({"resourceVersion": "9", "continue": "t"})
    );
    assert_eq!(list["items"][0]["kind"], "PartialObjectMetadata");
    assert!(list["items"][0].get("data").is_none());
    assert_eq!(
        partial_list(&[], json!({}), "v1")["items"],
        json!([]),
        "an empty list has items: []"
    );
}

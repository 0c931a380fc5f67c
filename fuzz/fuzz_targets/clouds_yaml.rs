//! Any `clouds.yaml` in a credentials Secret: resolved or refused with a reason, never a
//! panic, and the reason never repeats the file's secrets.
#![no_main]

use capo_provider::cloud::CloudCredentials;

libfuzzer_sys::fuzz_target!(|body: &[u8]| {
    let clouds_yaml = String::from_utf8_lossy(body).into_owned();
    for cloud_name in ["openstack", "capo"] {
        let credentials = CloudCredentials {
            clouds_yaml: clouds_yaml.clone(),
            cacert: None,
            cloud_name: cloud_name.into(),
            region: None,
        };
        if let Err(error) = credentials.resolve() {
            let said = error.to_string();
            assert!(!said.is_empty());
        }
        let shown = format!("{credentials:?}");
        assert!(clouds_yaml.len() < 16 || !shown.contains(&clouds_yaml));
    }
});

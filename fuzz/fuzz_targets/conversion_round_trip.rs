//! Any JSON object, as each convertible kind in each version: converting it never panics,
//! and what converts one way converts back.
#![no_main]

use capo_api::conversion::{CONVERTIBLE_KINDS, HUB, SPOKE, convert};

libfuzzer_sys::fuzz_target!(|body: &[u8]| {
    let Some((&pick, json)) = body.split_first() else {
        return;
    };
    let Ok(serde_json::Value::Object(mut object)) = serde_json::from_slice(json) else {
        return;
    };
    let kind = CONVERTIBLE_KINDS[usize::from(pick) % CONVERTIBLE_KINDS.len()];
    let (from, to) = if pick & 0x80 == 0 {
        (SPOKE, HUB)
    } else {
        (HUB, SPOKE)
    };
    let group = capo_api::GROUP;
    object.insert("kind".into(), kind.into());
    object.insert("apiVersion".into(), format!("{group}/{from}").into());
    let object = serde_json::Value::Object(object);
    if let Ok(there) = convert(&object, &format!("{group}/{to}")) {
        convert(&there, &format!("{group}/{from}")).expect("what converts one way converts back");
    }
});

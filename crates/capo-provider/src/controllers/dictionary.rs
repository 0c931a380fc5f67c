//! Small JSON documents deflated against a dictionary shared by the documents of one kind.
//! A stored object's JSON is a couple of KB, too short for deflate to find much to repeat
//! within it: its keys, condition types and API groups are new to each stream. Primed with
//! another object of the same kind, deflate refers to that object's text instead. An
//! OpenStackServer's 2.2 KB of JSON deflates to about 820 bytes alone and to about 110
//! against another server (docs/memory.md).

use std::any::TypeId;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, LazyLock, PoisonError, RwLock};
use std::thread::LocalKey;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// Deflate looks back 32 KiB at most: a longer dictionary's start is never used.
const WINDOW: usize = 32 * 1024;

/// A document, deflated, and the dictionary it was deflated against (which inflating it
/// needs: a kind's dictionary may be replaced since).
#[derive(Clone)]
pub struct Deflated {
    bytes: Arc<[u8]>,
    dictionary: Arc<[u8]>,
}

impl Deflated {
    /// `json`, deflated against the dictionary of `kind` (which `json` may become).
    pub fn new(kind: TypeId, json: &[u8]) -> io::Result<Self> {
        let dictionary = dictionary_for(kind, json);
        let bytes = deflate(json, &dictionary)?;
        Ok(Deflated {
            bytes: Arc::from(bytes.into_boxed_slice()),
            dictionary,
        })
    }

    /// The document's bytes, inflated.
    pub fn inflate(&self) -> io::Result<Vec<u8>> {
        inflate(&self.bytes, &self.dictionary)
    }

    /// How many bytes it takes, deflated (its dictionary is shared).
    pub fn size(&self) -> usize {
        self.bytes.len()
    }
}

/// Each kind's dictionary: the longest document of that kind seen so far, replaced when one
/// at least a quarter longer comes (a kind's first objects are often new ones, with no status
/// yet). The replaced ones live on in the documents deflated against them.
static DICTIONARIES: LazyLock<RwLock<HashMap<TypeId, Arc<[u8]>>>> = LazyLock::new(Default::default);

fn dictionary_for(kind: TypeId, json: &[u8]) -> Arc<[u8]> {
    let outgrown = |current: &Arc<[u8]>| {
        let longer = json.len().min(WINDOW);
        longer > current.len() + current.len() / 4
    };
    {
        // A panic elsewhere while the lock was held leaves the map whole: each dictionary is
        // one `Arc` swapped in.
        let dictionaries = DICTIONARIES.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(current) = dictionaries.get(&kind)
            && !outgrown(current)
        {
            return current.clone();
        }
    }
    let mut dictionaries = DICTIONARIES.write().unwrap_or_else(PoisonError::into_inner);
    let entry = dictionaries
        .entry(kind)
        .or_insert_with(|| Arc::from(&[][..]));
    if outgrown(entry) {
        let tail = json.len().saturating_sub(WINDOW);
        *entry = Arc::from(json.get(tail..).unwrap_or_default());
    }
    entry.clone()
}

thread_local! {
    // One of each per thread, reset for each document. A deflate state is about 270 KB in
    // several blocks; made for each object, glibc placed the stored objects in the holes
    // they left, and the heap grew by about 100 KB per object stored.
    static COMPRESS: RefCell<Compress> = RefCell::new(new_compress());
    static DECOMPRESS: RefCell<Decompress> = RefCell::new(new_decompress());
}

// Raw deflate (no zlib header): the dictionary is known to both sides.
fn new_compress() -> Compress {
    Compress::new(Compression::default(), false)
}

fn new_decompress() -> Decompress {
    Decompress::new(false)
}

/// `run` with this thread's `state`, reset; with a new one if that is in use.
fn with_reused<S, T>(
    state: &'static LocalKey<RefCell<S>>,
    new: fn() -> S,
    reset: fn(&mut S),
    run: impl Fn(&mut S) -> T,
) -> T {
    let reused = state.try_with(|cell| {
        cell.try_borrow_mut().ok().map(|mut state| {
            reset(&mut state);
            run(&mut state)
        })
    });
    match reused {
        Ok(Some(result)) => result,
        _ => run(&mut new()),
    }
}

fn deflate(json: &[u8], dictionary: &[u8]) -> io::Result<Vec<u8>> {
    with_reused(&COMPRESS, new_compress, Compress::reset, |compress| {
        deflate_with(compress, json, dictionary)
    })
}

fn deflate_with(compress: &mut Compress, json: &[u8], dictionary: &[u8]) -> io::Result<Vec<u8>> {
    if !dictionary.is_empty() {
        compress
            .set_dictionary(dictionary)
            .map_err(io::Error::other)?;
    }
    let mut out = Vec::with_capacity(json.len() / 4 + 64);
    loop {
        let done = usize::try_from(compress.total_in()).unwrap_or(usize::MAX);
        let rest = json.get(done..).unwrap_or_default();
        let status = compress
            .compress_vec(rest, &mut out, FlushCompress::Finish)
            .map_err(io::Error::other)?;
        if status == Status::StreamEnd {
            return Ok(out);
        }
        out.reserve(out.capacity().max(64));
    }
}

fn inflate(bytes: &[u8], dictionary: &[u8]) -> io::Result<Vec<u8>> {
    with_reused(
        &DECOMPRESS,
        new_decompress,
        |decompress| decompress.reset(false),
        |decompress| inflate_with(decompress, bytes, dictionary),
    )
}

fn inflate_with(
    decompress: &mut Decompress,
    bytes: &[u8],
    dictionary: &[u8],
) -> io::Result<Vec<u8>> {
    if !dictionary.is_empty() {
        decompress
            .set_dictionary(dictionary)
            .map_err(io::Error::other)?;
    }
    let mut out = Vec::with_capacity(bytes.len() * 16 + 1024);
    loop {
        let done = usize::try_from(decompress.total_in()).unwrap_or(usize::MAX);
        let rest = bytes.get(done..).unwrap_or_default();
        let before = (decompress.total_in(), decompress.total_out());
        let status = decompress
            .decompress_vec(rest, &mut out, FlushDecompress::Finish)
            .map_err(io::Error::other)?;
        if status == Status::StreamEnd {
            return Ok(out);
        }
        let stuck =
            (decompress.total_in(), decompress.total_out()) == before && out.len() < out.capacity();
        if stuck {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the deflated document ends early",
            ));
        }
        out.reserve(out.capacity().max(64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct KindA;
    struct KindB;
    struct KindC;

    fn document(i: u32, status: bool) -> Vec<u8> {
        let status = if status {
            r#","status":{"conditions":[{"type":"Ready","status":"True","reason":"Ready"}]}"#
        } else {
            ""
        };
        format!(
            r#"{{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta2","kind":"OpenStackServer","metadata":{{"name":"server-{i}","uid":"0000000{i}-5a30-4afa-980d-0000000000{i}"}},"spec":{{"flavor":"m1.small","image":{{"filter":{{"name":"ubuntu-2404-kube-v1.33.4"}}}}}}{status}}}"#
        )
        .into_bytes()
    }

    #[test]
    fn a_document_inflates_to_itself_and_is_smaller_against_its_kind() {
        let kind = TypeId::of::<KindA>();
        let first = Deflated::new(kind, &document(1, true)).unwrap();
        let second = Deflated::new(kind, &document(2, true)).unwrap();
        assert_eq!(first.inflate().unwrap(), document(1, true));
        assert_eq!(second.inflate().unwrap(), document(2, true));
        let alone = deflate(&document(2, true), &[]).unwrap().len();
        assert!(
            second.size() * 2 < alone,
            "{} bytes against the kind's dictionary, {alone} without",
            second.size(),
        );
    }

    #[test]
    fn a_longer_document_becomes_the_dictionary_and_older_ones_still_inflate() {
        let kind = TypeId::of::<KindB>();
        let short = Deflated::new(kind, &document(1, false)).unwrap();
        let long = Deflated::new(kind, &document(2, true)).unwrap();
        assert!(!Arc::ptr_eq(&short.dictionary, &long.dictionary));
        assert_eq!(&long.dictionary[..], &document(2, true)[..]);
        assert_eq!(short.inflate().unwrap(), document(1, false));
        assert_eq!(long.inflate().unwrap(), document(2, true));
    }

    #[test]
    fn a_cut_document_is_an_error_not_a_panic() {
        let kind = TypeId::of::<KindC>();
        let whole = Deflated::new(kind, &document(1, true)).unwrap();
        let cut = Deflated {
            bytes: Arc::from(&whole.bytes[..whole.bytes.len() / 2]),
            dictionary: whole.dictionary.clone(),
        };
        assert!(cut.inflate().is_err());
    }
}

//! The conformance suite against the in-memory reference store.

use std::sync::Arc;

use tarn_store::memory::MemoryStore;
use tarn_store::Store;

tarn_store::conformance_tests!(async { (Arc::new(MemoryStore::new()) as Arc<dyn Store>, ()) });

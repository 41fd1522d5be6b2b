//! Nothing here: the tests in `tests/it` run the engine against every store.

//! Harness for end-to-end tests: builds an emulated GPU host (libraries, state file, MPS pipe dir) per test.

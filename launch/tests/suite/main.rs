//! The launcher's tests: one binary, a module per topic.

mod secret_file;

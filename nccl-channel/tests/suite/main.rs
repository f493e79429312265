//! The crate's tests: one binary, a module per topic (linked once, not once per file).

mod all_to_all_v;
mod attacks;
mod checked_calls;
mod comm_id_real;
mod common;
mod compile_fail;
mod config;
mod control_flow;
mod control_flow_gpu;
#[cfg(feature = "rendezvous")]
mod data_parallel;
mod demo_gpu;
// One process per rank through the launcher, whose ranks meet at its rendezvous.
#[cfg(feature = "rendezvous")]
mod demo_mock;
#[cfg(feature = "rendezvous")]
mod elastic;
#[cfg(feature = "half")]
mod gpu;
#[cfg(feature = "rendezvous")]
mod hostile_input;
mod id_at_rest;
mod inputs;
// One process per rank through the launcher, whose ranks meet at its rendezvous.
#[cfg(feature = "rendezvous")]
mod launchers_mock;
mod lazy_open;
#[cfg(feature = "half")]
mod mock_collectives;
#[cfg(feature = "half")]
mod mock_comm;
mod mock_grow;
mod mock_reliability;
mod mock_split;
mod model_check;
// One process per rank through the launcher, whose ranks meet at its rendezvous.
#[cfg(feature = "rendezvous")]
mod moe_dispatch;
mod newer_api;
mod newer_api_attacks;
mod newer_api_gpu;
mod newer_api_real;
mod onesided;
mod onesided_processes;
mod params_real;
mod pool_attacks;
mod pool_policy;
mod printing;
mod quick_start;
mod registration;
mod registration_attacks;
mod registration_gpu;
mod reliability_gpu;
#[cfg(feature = "rendezvous")]
mod rendezvous;
// One process per rank through the launcher, whose ranks meet at its rendezvous.
#[cfg(feature = "rendezvous")]
mod rendezvous_auto;
#[cfg(feature = "rendezvous")]
mod rendezvous_real;
#[cfg(feature = "rendezvous")]
mod rendezvous_secret;
mod shrink_gpu;
mod simulator_processes;
mod soundness;
mod soundness_gpu;
mod split_on_every_backend;
mod symmetric;
mod tensor_parallel;
#[cfg(feature = "rendezvous")]
mod torch_store_real;
mod two_gpu;
mod views;
mod wait_notice;
mod world_env;

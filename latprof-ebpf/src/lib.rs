//! The crate's library face, empty: it exists so that latprof can name latprof-ebpf as a build
//! dependency, and cargo then rebuilds the eBPF object when this crate changes.
#![no_std]
// This file exists so that latprof can name latprof-ebpf as a build dependency: cargo then
// rebuilds the eBPF object when this crate changes. The programs are in main.rs
// and the modules it names.

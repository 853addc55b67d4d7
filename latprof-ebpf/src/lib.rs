#![no_std]
// This file exists so that latprof can name latprof-ebpf as a build dependency: cargo then
// rebuilds the eBPF object when this crate changes. The programs are in main.rs
// and the modules it names.

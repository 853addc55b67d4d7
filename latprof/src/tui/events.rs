//! What wakes `top`'s one loop: keys, a snapshot, spikes, or the end. The collector, the
//! spike reader and the terminal each send on one channel from a thread of their own, and the
//! loop draws after each batch of events, never on a timer.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc::Sender,
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, Result};
use ratatui::crossterm::event::KeyEvent;

use super::Input;
use crate::collect::{Snapshot, Spike};

/// One thing `top`'s loop handles.
pub enum Event {
    /// Keys typed (several when they came together).
    Keys(Vec<KeyEvent>),
    /// A snapshot from the collector (boxed: it is large, the other events small).
    Snapshot(Box<Snapshot>),
    /// Spikes from the reader, and its sleep count.
    Spikes(Vec<Spike>, u64),
    /// The terminal went away, or a signal asked latprof to stop.
    Stop,
    /// The collector or the terminal failed: top ends with this error.
    Failed(anyhow::Error),
}

/// How often the terminal's thread looks at the stop flag while no key comes.
const STOP_CHECK: Duration = Duration::from_millis(200);

/// The terminal's thread: sends the keys, and `Stop` when the terminal goes away or `stop`
/// is set (a signal); ends then, or when the loop has gone, or when `done` is set.
pub fn spawn_input(
    events: Sender<Event>,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("keys".into())
        .spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let event = match super::next_input(STOP_CHECK) {
                    Ok(Input::Keys(keys)) => Event::Keys(keys),
                    Ok(Input::Nothing) if !stop.load(Ordering::Relaxed) => continue,
                    Ok(Input::Nothing | Input::Gone) => Event::Stop,
                    Err(e) => Event::Failed(e.context("reading the terminal")),
                };
                let last = matches!(event, Event::Stop | Event::Failed(_));
                if events.send(event).is_err() || last {
                    break;
                }
            }
        })
        .context("starting the terminal's thread")
}

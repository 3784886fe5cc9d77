//! A driver's threads, stopped once and joined from whichever thread asks:
//! the program's, or one of the driver's own (a callback that shuts its
//! elector or group down, or drops the last handle to it). A thread never
//! joins itself; it returns, and ends after the callback does.

use std::thread::{self, JoinHandle};

use crate::error::ElectionError;

/// The thread that drives the election, the others that follow it, and
/// the result of the first stop.
#[derive(Default)]
pub(crate) struct Threads {
    pub(crate) driver: Option<JoinHandle<Result<(), ElectionError>>>,
    pub(crate) others: Vec<JoinHandle<()>>,
    result: Option<Result<(), ElectionError>>,
}

impl Threads {
    /// After `stop` has told the driver to stop: waits for it and then for
    /// the others, except the calling thread. The first call's result
    /// stands for every later one.
    pub(crate) fn join(&mut self, stop: impl FnOnce()) -> Result<(), ElectionError> {
        if let Some(result) = &self.result {
            return result.clone();
        }
        stop();
        let me = thread::current().id();
        let result = match self.driver.take() {
            Some(h) if h.thread().id() != me => h.join().unwrap_or(Err(ElectionError::Stopped)),
            // Stopped from its own thread: it ends when this call returns.
            Some(_) => Ok(()),
            None => Err(ElectionError::Stopped),
        };
        self.result = Some(result.clone());
        for h in self.others.drain(..) {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn a_thread_stopping_its_own_driver_is_not_joined_and_the_result_stands() {
        let (tx, rx) = mpsc::channel::<Threads>();
        let (done_tx, done_rx) = mpsc::channel();
        let other = thread::spawn(move || {
            let mut threads = rx.recv().unwrap();
            let first = threads.join(|| {});
            let again = threads.join(|| panic!("stopped twice"));
            done_tx.send((first.map_err(|e| e.to_string()), again.map_err(|e| e.to_string()))).unwrap();
        });
        let driver = thread::spawn(|| Err(ElectionError::Stopped));
        // The joining thread is one of the others: it gets its own handle.
        tx.send(Threads { driver: Some(driver), others: vec![other], result: None }).unwrap();
        let (first, again) = done_rx.recv().unwrap();
        assert_eq!(first, Err(ElectionError::Stopped.to_string()), "the driver's own result");
        assert_eq!(again, first);
    }

    #[test]
    fn a_driver_stopping_itself_is_not_joined_and_ends_well() {
        let (tx, rx) = mpsc::channel::<JoinHandle<Result<(), ElectionError>>>();
        let (done_tx, done_rx) = mpsc::channel::<Result<(), ElectionError>>();
        let driver = thread::spawn(move || {
            // A callback on the driver's own thread shuts it down.
            let mut threads = Threads { driver: Some(rx.recv().unwrap()), others: Vec::new(), result: None };
            done_tx.send(threads.join(|| {})).unwrap();
            Err(ElectionError::NotLeading)
        });
        tx.send(driver).unwrap();
        let stopped = done_rx.recv().unwrap();
        assert!(stopped.is_ok(), "stopped from its own thread, it ends when the call returns: {stopped:?}");
        let mut later = Threads::default();
        // Without a driver (none was started) there is nothing to stop.
        assert_eq!(later.join(|| {}).map_err(|e| e.to_string()), Err(ElectionError::Stopped.to_string()));
    }
}

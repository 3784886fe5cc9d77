//! Loom models of the driver's own hand-off: the shipped [`Handoff`] and
//! [`watchdog_fired`] over the real [`Machine`], in every interleaving with
//! the program's guards and the watchdog. Run with
//! `RUSTFLAGS="--cfg loom" cargo test --release --lib loom`.
//!
//! Only the threads around the hand-off are stood in for ([`Model`]): a clock
//! the model sets, store calls queued and answered by a [`MemStore`] on a
//! manual clock, and the commands read without blocking, as the renewal
//! thread's select loop would take them. Every model starts from the same
//! leader: term 1 taken at 0 s (deadline 13.5 s), its renewal sent at 5 s and
//! still unanswered. Each [`Mutant`] is a deliberate bug in the shipped code
//! that one model must catch; the `loom_mutant_` tests show it does.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;

use super::*;
use crate::config::Timing;
use crate::lease::DbTime;
use crate::machine::{MachineConfig, Op};
use crate::memstore::MemStore;

const NAME: &str = "jobs";
const ME: &str = "me";

const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// The first deadline: taken at 0 s for 15 s, less the 1.5 s margin.
const FIRST_DEADLINE: Duration = Duration::from_millis(13_500);
/// The renewal sent at 5 s moves it to 18.5 s.
const EXTENDED: Duration = Duration::from_millis(18_500);
/// When the renewal's answer is taken.
const ANSWERED: Duration = secs(6);
/// A resignation waits two retry periods before campaigning again.
const BACK_OFF: Duration = secs(6);

/// The threads around the hand-off, as a model: a clock the model sets, and
/// what the hand-off asked of them.
#[derive(Default)]
struct Model {
    now: Duration,
    calls: VecDeque<Call>,
    /// Every term handed to the watchdog, in order.
    watched: Vec<Arc<TermShared>>,
    /// When each acquire was sent.
    campaigns: Vec<Duration>,
    /// The machine's own word on each term's end.
    ended: Vec<(TermId, EndReason)>,
}

impl Outside for Model {
    fn now(&self) -> LocalTime {
        LocalTime::from_duration(self.now)
    }

    fn start_call(&mut self, call: Call) -> Result<(), Outcome> {
        if let Op::Acquire { .. } = call.op {
            for t in &self.watched {
                assert_eq!(t.guards(), 0, "campaigned while a guard of an ended term lives");
            }
            self.campaigns.push(self.now);
        }
        self.calls.push_back(call);
        Ok(())
    }

    fn term_store(&self) -> Option<Arc<TermStore>> {
        None
    }

    fn watch(&mut self, term: &Arc<TermShared>) {
        for t in &self.watched {
            assert!(t.is_ended() && t.guards() == 0, "a term started while an earlier one or its guard lives");
        }
        self.watched.push(Arc::clone(term));
    }

    fn event(&mut self, _ev: Event) {}

    fn saw(&mut self, out: &Output) {
        if let Output::TermEnded { term, reason, .. } = out {
            self.ended.push((*term, *reason));
        }
    }
}

/// The renewal thread, run by hand: the machine, the shipped hand-off, and a
/// store that answers the calls it starts.
struct Rig {
    machine: Machine,
    handoff: Handoff<Model>,
    store: MemStore,
    commands: Receiver<Command>,
    /// How many commands were sent (loom's view of the channel), and taken.
    sent: Arc<loom::sync::atomic::AtomicUsize>,
    taken: usize,
    shared: Arc<Shared>,
}

impl Rig {
    /// Term 1, taken at 0 s, with its renewal sent at 5 s and unanswered.
    fn leading(mutant: Option<Mutant>) -> Rig {
        let shared = Arc::new(Shared {
            origin: Instant::now(),
            name: NAME.into(),
            identity: ME.into(),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            mutant,
        });
        let (cmd_tx, commands) = crossbeam_channel::unbounded();
        let timing = Timing::default();
        let handoff = Handoff::new(
            Model::default(),
            Arc::clone(&shared),
            Counters::new(NAME),
            cmd_tx,
            false,
            timing.lease_duration,
        );
        // The database clock is days away from the local one.
        let store = MemStore::with_manual_clock(DbTime::from_unix_micros(86_400_000_000 * 40));
        let machine = Machine::new(MachineConfig::new(ME, timing, 1));
        let sent = Arc::clone(&handoff.cmd_tx.sent);
        let mut rig = Rig { machine, handoff, store, commands, sent, taken: 0, shared };
        rig.timeout(Duration::ZERO);
        rig.answer(); // inspect: no lease
        rig.answer(); // acquire: term 1
        rig.timeout(secs(5));
        assert_eq!(rig.handoff.outside.watched.len(), 1);
        assert!(matches!(rig.handoff.outside.calls.front(), Some(Call { op: Op::Renew { .. }, .. })));
        rig
    }

    fn term(&self, n: usize) -> Arc<TermShared> {
        Arc::clone(&self.handoff.outside.watched[n - 1])
    }

    fn set_clock(&mut self, t: Duration) {
        let now = &mut self.handoff.outside.now;
        self.store.advance(t.saturating_sub(*now));
        *now = (*now).max(t);
    }

    fn now(&self) -> LocalTime {
        self.handoff.outside.now()
    }

    fn timeout(&mut self, t: Duration) {
        self.set_clock(t);
        let now = self.now();
        self.machine.handle_timeout(now);
        self.handoff.drain(&mut self.machine);
    }

    /// Answers the oldest call the hand-off started, on the store, now.
    fn answer(&mut self) {
        let call = self.handoff.outside.calls.pop_front().expect("a call to answer");
        let outcome = call.op.run(&self.store, NAME, ME, b"", secs(3));
        let now = self.now();
        self.machine.handle_reply(now, call.id, outcome);
        self.handoff.drain(&mut self.machine);
    }

    fn answer_at(&mut self, t: Duration) {
        self.set_clock(t);
        self.answer();
    }

    /// The commands sent so far, as the select loop takes them: no more
    /// than the count shows, so each is ordered after its send.
    fn commands(&mut self) {
        let sent = self.sent.load(Ordering::Acquire);
        while self.taken < sent {
            let Ok(cmd) = self.commands.try_recv() else { break };
            self.taken += 1;
            let now = self.now();
            self.handoff.command(&mut self.machine, now, cmd);
            self.handoff.drain(&mut self.machine);
        }
    }

    /// The renewal thread's loop until `until`: commands, then answers, then
    /// timers.
    fn run_until(&mut self, until: Duration) {
        for _ in 0..200 {
            self.commands();
            if !self.handoff.outside.calls.is_empty() {
                self.answer();
                continue;
            }
            match self.machine.poll_timeout().map(LocalTime::as_duration) {
                Some(t) if t <= until => self.timeout(t),
                _ => return self.set_clock(until),
            }
        }
        panic!("the machine does not settle");
    }

    fn state(&self) -> crate::sync::MutexGuard<'_, State> {
        self.shared.state.lock()
    }

    /// Checks how term 1 ended: the machine said so once, giving one of the
    /// reasons in `own`, and the status counts the reason that won the
    /// term's compare-and-swap, once. Returns that reason.
    fn ended_once(&self, own: &[EndReason]) -> EndReason {
        let won = self.term(1).end_reason().expect("term 1 ended");
        let ended: Vec<_> = self.handoff.outside.ended.iter().filter(|(t, _)| *t == TermId(1)).collect();
        assert_eq!(ended.len(), 1, "the machine ends a term once: {ended:?}");
        assert!(own.contains(&ended[0].1), "the machine's own end of term 1: {ended:?}");
        let counted = self.state().figures.terms_ended;
        assert_eq!((counted.total(), counted), (1, counted_for(won)), "the status counts the winner once");
        won
    }
}

fn counted_for(reason: EndReason) -> crate::status::TermsEnded {
    let mut t = crate::status::TermsEnded::default();
    match reason {
        EndReason::Resigned => t.resigned = 1,
        EndReason::LeaseLost => t.lost = 1,
        EndReason::ExpiredLocally => t.expired = 1,
        EndReason::Fatal => t.fatal = 1,
        EndReason::Shutdown => t.shutdown = 1,
    }
    t
}

/// A guard as [`Elector::guard`](crate::Elector::guard) takes one: under the
/// state lock, of the current term if it is valid.
fn elector_guard(shared: &Shared, at: Duration) -> Option<LeaderGuard> {
    let st = shared.state.lock();
    st.term.as_ref().filter(|t| t.is_valid_at(at)).map(TermShared::guard)
}

/// The outcomes a model's interleavings reached, checked once every
/// interleaving has run: a model that never reached the race it is about
/// would pass without checking anything.
#[derive(Clone, Default)]
struct Reached(Arc<std::sync::Mutex<std::collections::BTreeSet<&'static str>>>);

impl Reached {
    fn saw(&self, what: &'static str) {
        self.0.lock().unwrap().insert(what);
    }

    fn all(&self, expected: &[&'static str]) {
        let seen = self.0.lock().unwrap();
        for what in expected {
            assert!(seen.contains(what), "no interleaving reached {what:?}; reached {seen:?}");
        }
    }
}

/// Runs `model` in every interleaving; without a mutant, checks that they
/// reached every outcome in `expected`.
fn explore(mutant: Option<Mutant>, expected: &[&'static str], model: impl Fn(Rig, &Reached) + Send + Sync + 'static) {
    let reached = Reached::default();
    let r = reached.clone();
    loom::model(move || model(Rig::leading(mutant), &r));
    if mutant.is_none() {
        reached.all(expected);
    }
}

/// (a) The renewal thread ends term 1 on the machine's word (the lease is
/// gone) while the program drops its last guard; then it takes the store's
/// answers before the commands (its select may), so it may claim term 2
/// before it reads the guard's late notice. Whichever ended term 1, the
/// machine ended it once, the status counts the winner, a resignation that
/// won still backs off, the machine campaigns again, and term 2 is left
/// alone.
fn lost_as_the_last_guard_drops(mutant: Option<Mutant>) {
    let expected = ["resigned first", "lost first", "held back", "late notice in term 2"];
    explore(mutant, &expected, |mut rig, reached| {
        rig.store.clear(); // the renewal will find the lease gone
        let guard = elector_guard(&rig.shared, ANSWERED).expect("term 1 is valid");
        let user = thread::spawn(move || drop(guard));
        rig.answer_at(ANSWERED);
        if rig.handoff.held_back.is_some() {
            reached.saw("held back");
        }
        user.join().unwrap();
        while !rig.handoff.outside.calls.is_empty() {
            rig.answer();
        }
        if rig.handoff.outside.watched.len() == 2 && rig.taken < rig.sent.load(Ordering::Acquire) {
            reached.saw("late notice in term 2");
        }
        rig.run_until(secs(14));
        let won = rig.ended_once(&[EndReason::LeaseLost]);
        let first = *rig.handoff.outside.campaigns.get(1).expect("campaigns again: never held back forever");
        if won == EndReason::Resigned {
            reached.saw("resigned first");
            assert!(
                first >= ANSWERED + BACK_OFF,
                "a resignation that beat the loss backs off: campaigned at {first:?}"
            );
        } else {
            reached.saw("lost first");
            assert_eq!(won, EndReason::LeaseLost);
            assert_eq!(first, ANSWERED, "a lost lease is claimed again at once");
        }
        assert_eq!(rig.handoff.outside.watched.len(), 2, "term 2 started");
        assert!(rig.machine.term().is_some_and(|t| t.id == TermId(2)), "term 2 still leads");
        assert!(!rig.state().held_back);
    });
}

/// (a) `resign()` races the machine's own end of term 1. It waits for an
/// answer only if it won, and gets one; its guard, alive until `resign()`
/// returns, holds the next campaign back, and dropping it lets go.
fn resign_as_the_lease_is_lost(mutant: Option<Mutant>) {
    explore(mutant, &["resigned first", "lost first"], |mut rig, reached| {
        rig.store.clear();
        let guard = elector_guard(&rig.shared, ANSWERED).expect("term 1 is valid");
        let user = thread::spawn(move || {
            let answer = guard.begin_resign();
            (guard, answer)
        });
        rig.answer_at(ANSWERED);
        let (guard, answer) = user.join().unwrap();
        rig.run_until(secs(20));
        let won = rig.ended_once(&[EndReason::LeaseLost]);
        reached.saw(if won == EndReason::Resigned { "resigned first" } else { "lost first" });
        assert_eq!(answer.is_some(), won == EndReason::Resigned, "resign() waits only if it won");
        if let Some(answer) = answer {
            assert!(matches!(answer.try_recv(), Ok(Ok(()))), "resign() is answered: nothing was left to release");
        }
        assert!(rig.state().held_back, "the resigning guard holds the next term back");
        assert!(rig.handoff.outside.campaigns.len() == 1 && rig.machine.term().is_none());
        drop(guard);
        rig.run_until(secs(21));
        assert!(!rig.state().held_back);
        assert_eq!(rig.handoff.outside.watched.len(), 2, "term 2 started once the guard went");
    });
}

/// (b) The watchdog wakes at the first deadline and fires while the renewal
/// thread takes the answer that extends it (after reading the commands sent
/// so far, if `commands_first`: its select may take either first). A
/// watchdog that wakes after the extension keeps the term; an extension taken
/// after the watchdog ended the term does not revive it in the machine.
/// Either way the machine and the shared state agree once the commands are
/// read.
fn watchdog_fires_as_the_deadline_moves(mutant: Option<Mutant>, commands_first: bool) {
    let expected = ["kept", "expired", "extension after the end"];
    explore(mutant, &expected, move |mut rig, reached| {
        let term = rig.term(1);
        let armed = term.deadline();
        assert_eq!(armed, rig.shared.origin + FIRST_DEADLINE);
        let (extended, fired) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let dog = {
            let (shared, extended, fired) = (Arc::clone(&rig.shared), Arc::clone(&extended), Arc::clone(&fired));
            thread::spawn(move || {
                let saw_extension = extended.load(Ordering::Acquire);
                let kept = watchdog_fired(&shared, term, armed).is_some();
                fired.store(true, Ordering::Release);
                if saw_extension {
                    assert!(kept, "a watchdog that wakes after the extension keeps the term");
                }
            })
        };
        let after_fire = fired.load(Ordering::Acquire);
        if commands_first {
            rig.commands();
        }
        rig.answer_at(ANSWERED);
        extended.store(true, Ordering::Release);
        if after_fire {
            reached.saw("extension after the end");
            assert!(rig.machine.term().is_none(), "an extension taken after the term's end must not revive it");
        }
        dog.join().unwrap();
        rig.commands();
        let term = rig.term(1);
        match rig.machine.term() {
            Some(t) => {
                reached.saw("kept");
                assert_eq!(t.deadline.as_duration(), EXTENDED);
                assert!(term.is_valid_at(FIRST_DEADLINE + secs(1)), "the shared term lives as the machine's does");
                assert!(rig.handoff.outside.ended.is_empty());
            }
            None => {
                reached.saw("expired");
                assert_eq!(rig.ended_once(&[EndReason::ExpiredLocally]), EndReason::ExpiredLocally);
                // Taken after the expiry, the renewal's success clears the
                // machine's last error, as any successful call does.
                if !commands_first {
                    assert!(matches!(rig.state().last_error, Some(ElectionError::LeaseExpiredLocally { .. })));
                }
            }
        }
    });
}

/// (c) The last guard drops while the program takes a new one (as
/// `Elector::guard` does) and the renewal's answer lands (after the commands
/// sent so far, if `commands_first`). A guard taken as the term ended is
/// invalid from the start, and until it goes the machine is held back: it
/// never campaigns while a guard of an ended term lives, and never stays held
/// back once the last one has gone.
fn a_guard_taken_as_the_last_one_drops(mutant: Option<Mutant>, commands_first: bool) {
    let expected = ["late guard", "guard of the live term", "no guard"];
    explore(mutant, &expected, move |mut rig, reached| {
        let guard = elector_guard(&rig.shared, ANSWERED).expect("term 1 is valid");
        let user = thread::spawn(move || drop(guard));
        let taker = {
            let shared = Arc::clone(&rig.shared);
            thread::spawn(move || elector_guard(&shared, ANSWERED))
        };
        if commands_first {
            rig.commands();
        }
        rig.answer_at(ANSWERED);
        user.join().unwrap();
        let taken = taker.join().unwrap();
        rig.commands();
        let term = rig.term(1);
        let late = taken.is_some() && term.is_ended();
        reached.saw(match (&taken, late) {
            (None, _) => "no guard",
            (Some(_), true) => "late guard",
            (Some(_), false) => "guard of the live term",
        });
        assert_eq!(rig.machine.term().is_some(), !term.is_ended(), "the machine and the shared term agree");
        assert_eq!(rig.state().held_back, late, "held back exactly while a guard of the ended term lives");
        if let Some(g) = &taken {
            assert_eq!(g.is_valid_at_for_test(ANSWERED), !late, "a guard taken as the term ended is invalid");
            rig.run_until(secs(20));
            assert_eq!(rig.handoff.outside.campaigns.len(), 1, "no campaign while the taken guard lives");
        }
        drop(taken);
        rig.run_until(secs(27));
        assert_eq!(rig.ended_once(&[EndReason::Resigned]), EndReason::Resigned);
        assert!(!rig.state().held_back);
        assert_eq!(rig.handoff.outside.watched.len(), 2, "term 2 started once the last guard went");
    });
}

/// (d) Two consecutive terms. The watchdog fires at term 1's deadline while
/// the renewal thread ends term 1 on the machine's word (lease gone); then it
/// takes the store's answers before the commands, claims term 2 at once, and
/// only then reads the watchdog's late expiry of term 1. The machine must not
/// take it for term 2, and no guard of term 1 is valid during term 2.
fn a_late_command_of_term_1_meets_term_2(mutant: Option<Mutant>) {
    explore(mutant, &["late expiry in term 2", "lost first"], |mut rig, reached| {
        rig.store.clear();
        let term1 = rig.term(1);
        let dog = {
            let (shared, term, armed) = (Arc::clone(&rig.shared), Arc::clone(&term1), term1.deadline());
            thread::spawn(move || {
                watchdog_fired(&shared, term, armed);
            })
        };
        rig.answer_at(ANSWERED);
        dog.join().unwrap();
        while !rig.handoff.outside.calls.is_empty() {
            rig.answer();
        }
        assert_eq!(rig.handoff.outside.watched.len(), 2, "term 2 started at once");
        reached.saw(match term1.end_reason() {
            Some(EndReason::ExpiredLocally) => "late expiry in term 2",
            _ => "lost first",
        });
        rig.run_until(secs(14));
        assert!(rig.handoff.outside.ended.iter().all(|(t, _)| *t == TermId(1)), "a late command ended term 2");
        let term2 = rig.term(2);
        assert!(rig.machine.term().is_some_and(|t| t.id == TermId(2)), "term 2 still leads");
        assert!(!term2.is_ended() && term2.is_valid_at(secs(14)), "term 2 is live");
        assert!(!term1.is_valid_at(Duration::ZERO), "no guard of term 1 is valid during term 2");
        rig.ended_once(&[EndReason::LeaseLost]);
    });
}

#[test]
fn loom_the_lease_is_lost_as_the_last_guard_drops() {
    lost_as_the_last_guard_drops(None);
}

#[test]
fn loom_resign_races_the_machine_ending_the_term() {
    resign_as_the_lease_is_lost(None);
}

#[test]
fn loom_the_watchdog_fires_as_a_renewal_moves_the_deadline() {
    watchdog_fires_as_the_deadline_moves(None, false);
    watchdog_fires_as_the_deadline_moves(None, true);
}

#[test]
fn loom_a_guard_taken_as_the_last_one_drops_holds_the_next_term_back() {
    a_guard_taken_as_the_last_one_drops(None, false);
    a_guard_taken_as_the_last_one_drops(None, true);
}

#[test]
fn loom_a_late_command_of_the_first_term_leaves_the_second_alone() {
    a_late_command_of_term_1_meets_term_2(None);
}

#[test]
#[should_panic(expected = "an extension taken after the term's end must not revive it")]
fn loom_mutant_ignore_extend_answer_is_caught() {
    watchdog_fires_as_the_deadline_moves(Some(Mutant::IgnoreExtendAnswer), false);
}

#[test]
#[should_panic(expected = "a watchdog that wakes after the extension keeps the term")]
fn loom_mutant_watchdog_skips_reread_is_caught() {
    watchdog_fires_as_the_deadline_moves(Some(Mutant::WatchdogSkipsReread), false);
}

#[test]
#[should_panic(expected = "held back exactly while a guard of the ended term lives")]
fn loom_mutant_stale_guard_count_is_caught() {
    a_guard_taken_as_the_last_one_drops(Some(Mutant::StaleGuardCount), false);
}

#[test]
#[should_panic(expected = "a late command ended term 2")]
fn loom_mutant_command_term_unchecked_is_caught() {
    a_late_command_of_term_1_meets_term_2(Some(Mutant::CommandTermUnchecked));
}

#[test]
#[should_panic(expected = "a resignation that beat the loss backs off")]
fn loom_mutant_resignation_forgotten_is_caught() {
    lost_as_the_last_guard_drops(Some(Mutant::ResignationForgotten));
}

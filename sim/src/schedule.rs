//! A fault schedule, decoded from a byte string so that a fuzzer can drive
//! it, and generated from a seed for ordinary exploration.

use std::fmt;
use std::time::Duration;

use super::rng::{scale, Bytes, SimRng};
use crate::fleet::{window_end, Window, Windowed};
use leaderelection::{default_safety_margin, Timing};

/// Fault records whose kind byte is at least this decode to operator
/// faults (one in 32 of random records).
pub const OPERATOR_KINDS: u8 = 0xf8;

/// One million: clock rates are in parts per million of the database clock.
pub const PPM: u64 = 1_000_000;

/// The most participants a schedule has.
pub const MAX_HOSTS: usize = 7;

/// The most faults decoded from one byte string.
pub const MAX_FAULTS: usize = 24;

/// How the participants are driven: the production driver, or a broken one
/// used as a negative control.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The production rules: timings that pass [`Timing::validate`], clock
    /// rates within what the safety margin absorbs, deadlines anchored at
    /// send time, a guard that re-reads the clock and a machine whose
    /// timers fire while a call hangs.
    Normal,
    /// **Broken on purpose.** No safety margin, and every clock runs slower
    /// than the database's (0.90 to 0.995 of its rate).
    NoMarginSkewed,
    /// **Broken on purpose.** The margin is kept but clocks run at 0.80 to
    /// 0.88 of the database's rate, past what a tenth of the lease absorbs.
    SkewedPastMargin,
    /// **Broken on purpose.** The default timings, clocks just slower than
    /// the margin absorbs: 0.980 to 0.995 of the slowest safe rate.
    JustPastMargin,
    /// **Broken on purpose.** Deadlines anchored at the reply
    /// ([`MachineConfig::unsafe_anchor_at_reply`](leaderelection::machine::MachineConfig)),
    /// with slow replies to some participants and fast ones to others.
    AnchorAtReply,
    /// **Broken on purpose.** A driver that blocks on each store call with no
    /// timeout and no watchdog: the guard is valid while the term exists,
    /// and the machine's timers do not fire while a call hangs.
    NoWatchdog,
    /// **Broken on purpose.** A driver that tells every machine that guards
    /// of an old term are still alive, forever: nobody ever campaigns. Safe,
    /// and useless; the liveness property must catch it.
    NeverCampaigns,
    /// **Broken on purpose.** The store assigns fences by the rule before
    /// 2026-12: an absent row starts at 1 and an expired one goes to fence + 1.
    /// Fine until an operator deletes the row, restores an older copy or
    /// re-creates the table ([`Fault::DeleteRow`], [`Fault::RestoreRow`],
    /// [`Fault::ClearTable`]): then a fence is issued again or goes backwards,
    /// which the oracle must catch.
    OldFenceRule,
    /// **Broken on purpose.** Operator faults do not wait for the database
    /// clock to pass the last fence issued ([`OPERATOR_CLOCK_WAIT`]): a row
    /// deleted in the microsecond of a claim lets the next claim in that
    /// microsecond repeat its fence. Shows that the wait is needed, and that
    /// the fence rule's clock caveat is real.
    NoOperatorClockWait,
    /// **Broken on purpose.** A store whose `renew` answers success when the
    /// lease is gone or names somebody else (it writes nothing): an old
    /// leader keeps renewing after its row was deleted or replaced. The
    /// overlap an operator fault allows must not cover it.
    RenewsLostLease,
    /// **Broken on purpose.** A store that claims an expired row inherited
    /// across a failover at once ([`Fault::Failover`]), as one that does
    /// not know about failovers would: the holder, told by the old server
    /// that its lease runs on, still leads when the claim lands.
    ClaimsInheritedRows,
    /// **Broken on purpose.** A woken follower leads at once under the next
    /// fence, without the conditional claim
    /// ([`MachineConfig::unsafe_lead_on_wake`](leaderelection::machine::MachineConfig)).
    /// Only schedules whose bytes turn the release feed on
    /// ([`Schedule::wakes`]) wake anybody; the others run as
    /// [`Variant::Normal`].
    LeadsOnWake,
}

impl Variant {
    /// Every variant, the production one first.
    pub const ALL: [Variant; 12] = [
        Variant::Normal,
        Variant::NoMarginSkewed,
        Variant::SkewedPastMargin,
        Variant::JustPastMargin,
        Variant::AnchorAtReply,
        Variant::NoWatchdog,
        Variant::NeverCampaigns,
        Variant::OldFenceRule,
        Variant::NoOperatorClockWait,
        Variant::RenewsLostLease,
        Variant::ClaimsInheritedRows,
        Variant::LeadsOnWake,
    ];

    /// The name used in replay commands (`SIM_VARIANT=...`).
    pub fn name(self) -> &'static str {
        match self {
            Variant::Normal => "normal",
            Variant::NoMarginSkewed => "no-margin-skewed",
            Variant::SkewedPastMargin => "skewed-past-margin",
            Variant::JustPastMargin => "just-past-margin",
            Variant::AnchorAtReply => "anchor-at-reply",
            Variant::NoWatchdog => "no-watchdog",
            Variant::NeverCampaigns => "never-campaigns",
            Variant::OldFenceRule => "old-fence-rule",
            Variant::NoOperatorClockWait => "no-operator-clock-wait",
            Variant::RenewsLostLease => "renews-lost-lease",
            Variant::ClaimsInheritedRows => "claims-inherited-rows",
            Variant::LeadsOnWake => "leads-on-wake",
        }
    }

    /// The variant called `name`.
    pub fn from_name(name: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == name)
    }
}

/// One participant's machine: its clock and its network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// Its local clock's rate, in millionths of the database clock's.
    pub rate_ppm: u64,
    /// Its local clock's reading at virtual instant zero (days of uptime:
    /// nowhere near the database clock).
    pub clock_offset: Duration,
    /// Each request to the database takes between these two.
    pub req_delay: (Duration, Duration),
    /// Each reply from the database takes between these two.
    pub rep_delay: (Duration, Duration),
    /// When its first process starts.
    pub start_at: Duration,
    /// Whether its processes release the lease when they shut down.
    pub release_on_shutdown: bool,
    /// How long its program keeps the guards of a term after the term ends
    /// (on its own clock). While it does, the elector holds the machine back
    /// from campaigning ([`Machine::set_hold_back`](leaderelection::machine::Machine::set_hold_back)).
    /// Zero: guards are dropped at once (always, in a group).
    pub guard_hold: Duration,
    /// In a group: where its processes' grids start, below the tick (zero
    /// for one election, which has no grid).
    pub phase: Duration,
}

impl fmt::Display for Host {
    /// Its clock, links and start (what a schedule's description shows
    /// of every host).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rate {:.6} offset {:?} req {:?}..{:?} rep {:?}..{:?} start {:?}",
            self.rate_ppm as f64 / PPM as f64,
            self.clock_offset,
            self.req_delay.0,
            self.req_delay.1,
            self.rep_delay.0,
            self.rep_delay.1,
            self.start_at
        )
    }
}

/// The slowest clock rate of any of `hosts`, in ppm.
pub(crate) fn min_rate_ppm(hosts: &[Host]) -> u64 {
    hosts.iter().map(|h| h.rate_ppm).min().unwrap_or(PPM)
}

/// The longest request delay and round trip of any of `hosts` with no
/// fault.
pub(crate) fn max_delays(hosts: &[Host]) -> (Duration, Duration) {
    let req = hosts.iter().map(|h| h.req_delay.1).max().unwrap_or_default();
    let rtt = hosts.iter().map(|h| h.req_delay.1 + h.rep_delay.1).max().unwrap_or_default();
    (req, rtt)
}

/// A host's six bytes in a schedule: clock rate, clock offset, request
/// delay, reply delay, start, flags (bit 7: no release).
pub(crate) struct HostBytes {
    pub(crate) rate: u8,
    offset: u8,
    req: u8,
    rep: u8,
    pub(crate) start: u8,
    pub(crate) flags: u8,
}

impl HostBytes {
    pub(crate) fn read(r: &mut Bytes) -> HostBytes {
        let (rate, offset, req, rep, start, flags) = (r.u8(), r.u8(), r.u8(), r.u8(), r.u8(), r.u8());
        HostBytes { rate, offset, req, rep, start, flags }
    }

    /// The production clock rate its byte picks within `(lo, hi)`, the
    /// safe range: a sixteenth at the slowest, an eighth exact, the rest
    /// spread over the range.
    pub(crate) fn safe_rate(&self, (lo, hi): (u64, u64)) -> u64 {
        match self.rate {
            0..=15 => lo,
            16..=47 => PPM,
            b => lo + (hi - lo) * u64::from(b - 48) / 207,
        }
    }

    /// The host: its clock at `rate_ppm`, requests and replies each taking
    /// up to `link` (a quarter of the operation timeout, so a round trip
    /// fits in half of it), or with `slow_replies` replies slower than the
    /// safety margin but inside the timeout; first started at `start_at`;
    /// no guard hold and no phase.
    pub(crate) fn host(
        &self, timing: &Timing, rate_ppm: u64, link: Duration, slow_replies: bool, start_at: Duration,
    ) -> Host {
        let op = timing.operation_timeout;
        let req_hi = scale(link, u64::from(self.req), 255);
        let mut rep_hi = scale(link, u64::from(self.rep), 255);
        let mut rep_lo = rep_hi / 2;
        if slow_replies {
            let m = timing.safety_margin;
            rep_lo = m + (op - m) / 3;
            rep_hi = rep_lo;
        }
        Host {
            rate_ppm,
            clock_offset: Duration::from_secs(86_400) * u32::from(self.offset) / 16
                + Duration::from_nanos(u64::from(self.flags) * 1_000_003),
            req_delay: (req_hi / 2, req_hi),
            rep_delay: (rep_lo, rep_hi.max(rep_lo)),
            start_at,
            release_on_shutdown: self.flags & 0x80 == 0,
            guard_hold: Duration::ZERO,
            phase: Duration::ZERO,
        }
    }
}

/// A fault record's head: its kind, when it starts (within `horizon`)
/// and whom it hits (a `who` byte of 128 and up: the leader; else a host
/// of `hosts`).
pub(crate) fn fault_head(r: &mut Bytes, horizon: Duration, hosts: usize) -> (u8, Duration, Target) {
    let kind = r.u8();
    let at = scale(horizon, u64::from(r.u16()), 65_535);
    let who = r.u8();
    let target = if who >= 128 { Target::Leader } else { Target::Host(usize::from(who) % hosts) };
    (kind, at, target)
}

/// Which participant a fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// This host (its current process).
    Host(usize),
    /// Whoever holds a valid guard when the fault starts (host 0 if nobody);
    /// in a group, the process leading the most elections.
    Leader,
}

/// What goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The database stops answering (SIGSTOP): requests wait and are applied
    /// in order when it resumes.
    PauseDb {
        /// For how long.
        dur: Duration,
    },
    /// Every message to or from the host is lost.
    Partition {
        /// Who.
        target: Target,
        /// For how long.
        dur: Duration,
    },
    /// Some requests are lost (never applied) and some replies are lost (the
    /// write lands, the answer never comes).
    Lossy {
        /// Who.
        target: Target,
        /// For how long.
        dur: Duration,
        /// Percentage of requests lost.
        req_loss: u8,
        /// Percentage of replies lost.
        rep_loss: u8,
    },
    /// Messages sent by or to the host take `extra` longer, possibly past
    /// the operation timeout, so late answers reach abandoned calls.
    SlowNet {
        /// Who.
        target: Target,
        /// For how long.
        dur: Duration,
        /// Added to every delay.
        extra: Duration,
    },
    /// Every statement fails at once with an error.
    DbFailing {
        /// For how long.
        dur: Duration,
        /// Fatal rather than retryable.
        fatal: bool,
    },
    /// The process dies without a word; its lease stays on the record. A new
    /// process with a fresh identity starts after `down`.
    Crash {
        /// Who.
        target: Target,
        /// Downtime.
        down: Duration,
    },
    /// The process shuts down cleanly (ends its term, releases); a new one
    /// with a fresh identity starts after `down`.
    Shutdown {
        /// Who.
        target: Target,
        /// Downtime.
        down: Duration,
    },
    /// The program drops its guard while the term is live: it resigns.
    Resign {
        /// Who.
        target: Target,
    },
    /// **Operator.** Somebody deletes the election's row (`DELETE`), between
    /// terms or under a live lease.
    DeleteRow,
    /// **Failover.** The row as it stood `lag` earlier comes back over the
    /// current one, as when a replica that lags by `lag` is promoted (no row
    /// at all if the election had none then).
    RestoreRow {
        /// How far behind the promoted copy is.
        lag: Duration,
    },
    /// **Operator.** The table is dropped and re-created: every row goes.
    ClearTable,
    /// **Failover.** The database fails over to a replica that lags by
    /// `lag`: the row as it stood then replaces the current one, written
    /// under the old server's history, so renewals the old server
    /// acknowledged may be gone ([`MemStore::fail_over`](leaderelection::MemStore::fail_over)).
    /// Not an operator fault: the oracle's rules stay as they are. (A
    /// replica that had no row yet keeps the current one: a row created
    /// less than `lag` before the failover and lost with it is a case the
    /// store cannot tell from a new election; see docs/design.md.)
    Failover {
        /// How far behind the promoted replica is.
        lag: Duration,
    },
}

impl Fault {
    /// Whether it is an operator's or a failover's change to the database's
    /// state ([`Fault::DeleteRow`], [`Fault::RestoreRow`],
    /// [`Fault::ClearTable`]), which the oracle judges by the relaxed rule
    /// (see the crate docs).
    pub fn is_operator(&self) -> bool {
        matches!(self, Fault::DeleteRow | Fault::RestoreRow { .. } | Fault::ClearTable)
    }

    /// How old the replica's or backup's copy is, for a failover or a
    /// restore; zero for every other fault.
    pub fn lag(&self) -> Duration {
        match *self {
            Fault::RestoreRow { lag } | Fault::Failover { lag } => lag,
            _ => Duration::ZERO,
        }
    }

    /// Whether it changes the database's rows behind the participants'
    /// backs: an operator fault or a failover ([`Fault::Failover`]).
    pub fn changes_rows(&self) -> bool {
        self.is_operator() || matches!(self, Fault::Failover { .. })
    }
}

impl Windowed for Fault {
    fn window(&self) -> Option<(Option<Target>, Duration, Window)> {
        Some(match *self {
            Fault::PauseDb { dur } => (None, dur, Window::PauseDb),
            Fault::DbFailing { dur, fatal } => (None, dur, Window::DbFailing { fatal }),
            Fault::Partition { target, dur } => (Some(target), dur, Window::Partition),
            Fault::Lossy { target, dur, req_loss, rep_loss } => {
                (Some(target), dur, Window::Lossy { req_loss, rep_loss })
            }
            Fault::SlowNet { target, dur, extra } => (Some(target), dur, Window::SlowNet { extra }),
            _ => return None,
        })
    }
}

/// How long an operator fault waits for the database clock to move past the
/// last fence issued (see [`Schedule::from_bytes`]): what the acceptance
/// suite waits before its operator events.
pub const OPERATOR_CLOCK_WAIT: Duration = Duration::from_millis(2);

/// A fault and when it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimedFault {
    /// Virtual time since the start of the run.
    pub at: Duration,
    /// What happens.
    pub fault: Fault,
}

/// The store's feed of releases ([`Store::releases`](leaderelection::Store::releases))
/// as a run has it: a release that ended a live term wakes every other
/// running participant
/// ([`Machine::handle_wake`](leaderelection::machine::Machine::handle_wake)),
/// each after a reply's delay on its link. The feed is a hint and the run
/// treats it as one: a partitioned participant gets nothing, a lossy link
/// loses wakes as it loses replies, a slow one delays them, and besides
/// those `loss` percent are lost and `dup` percent come a second time, up
/// to a retry period after the first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WakeFeed {
    /// Percentage of wakes lost on any link.
    pub loss: u8,
    /// Percentage of wakes delivered twice.
    pub dup: u8,
}

impl WakeFeed {
    /// The feed a schedule's bits ask for: none unless `on`; its loss and
    /// duplicates by the low two bits of `loss` and `dup`, each 0, 10, 30
    /// or 60 percent.
    pub(crate) fn decode(on: bool, loss: u8, dup: u8) -> Option<WakeFeed> {
        const LEVELS: [u8; 4] = [0, 10, 30, 60];
        on.then(|| WakeFeed { loss: LEVELS[usize::from(loss & 3)], dup: LEVELS[usize::from(dup & 3)] })
    }
}

/// Everything one simulated run depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// The bytes it was decoded from.
    pub bytes: Vec<u8>,
    /// The variant applied on top of the bytes.
    pub variant: Variant,
    /// Seeds message delays, loss, identities and jitter.
    pub seed: u64,
    /// The durations every participant runs with.
    pub timing: Timing,
    /// The participants (2 to 7).
    pub hosts: Vec<Host>,
    /// The faults, in the order decoded.
    pub faults: Vec<TimedFault>,
    /// The release feed, if the participants have one (`None`: they learn
    /// of a release at their next poll, as before the feed existed).
    pub wakes: Option<WakeFeed>,
}

/// The production range of clock rates for `timing`, in ppm: from just above
/// `1 - safety_margin/lease` (a clock that slow still steps down before the
/// database lets the lease go) to as far above one.
pub fn safe_rate_range(timing: &Timing) -> (u64, u64) {
    let margin = timing.safety_margin.as_nanos();
    let lease = timing.lease_duration.as_nanos().max(1);
    let slack = (u128::from(PPM) * margin / lease) as u64;
    // 20 ppm above the exact boundary absorbs the microsecond rounding of
    // the database clock and the nanosecond rounding of the local ones.
    let lo = (PPM - slack.min(PPM / 2)) + 20;
    let hi = (2 * PPM).saturating_sub(lo).max(lo);
    (lo, hi)
}

fn timing_template(t: u8, aux: u8) -> Timing {
    let on_boundary = Timing { lease_duration: Duration::from_millis(13_750), ..Timing::default() };
    timing_template_for(t, aux, on_boundary, |t| t.validate().is_ok())
}

/// The timing a schedule's bytes `t` and `aux` pick, for one election or a
/// group: `on_boundary` is template 5, a timing exactly on the invariant of
/// what runs it; a template that `valid` refuses falls back to the defaults.
pub(crate) fn timing_template_for(t: u8, aux: u8, on_boundary: Timing, valid: impl Fn(&Timing) -> bool) -> Timing {
    let d = Timing::default();
    let scaled = |num: u64, den: u64| Timing {
        lease_duration: scale(d.lease_duration, num, den),
        renew_interval: scale(d.renew_interval, num, den),
        retry_period: scale(d.retry_period, num, den),
        operation_timeout: scale(d.operation_timeout, num, den),
        safety_margin: scale(d.safety_margin, num, den),
    };
    let s = Duration::from_secs;
    let candidate = match t % 8 {
        0..=2 => d,
        // A tenth of the defaults: 1.5 s leases (a group's tick: 50 ms).
        3 => scaled(1, 10),
        // Forty times the defaults: ten-minute leases, hours of virtual time.
        4 => scaled(40, 1),
        // Exactly on the timing invariant's boundary.
        5 => on_boundary,
        // A lease between 2 and 61 s with proportional timings.
        6 => {
            let lease = s(2 + u64::from(aux % 60));
            Timing {
                lease_duration: lease,
                renew_interval: lease / 4,
                retry_period: lease / 5,
                operation_timeout: lease / 8,
                safety_margin: default_safety_margin(lease).min(lease / 8),
            }
        }
        // A wide margin (absorbs clocks 27 % slow).
        _ => Timing {
            lease_duration: s(15),
            renew_interval: s(4),
            retry_period: s(2),
            operation_timeout: s(2),
            safety_margin: s(4),
        },
    };
    if valid(&candidate) {
        candidate
    } else {
        d
    }
}

impl Schedule {
    /// Decodes `bytes`. Every byte string decodes to a schedule: missing bytes
    /// read as zero and extra bytes are ignored.
    ///
    /// The layout: three header bytes (fleet size, timing template, its
    /// parameter), six bytes per host, an eight-byte seed, then six-byte fault
    /// records `kind, at (u16), who, p1, p2`. A record's `kind % 16` picks a
    /// fault of the network, the database or a process; a `kind` of
    /// [`OPERATOR_KINDS`] (`0xf8`) or more picks an operator fault instead:
    /// `0xf8..=0xfa` [`Fault::DeleteRow`], `0xfb` [`Fault::RestoreRow`]
    /// with a lag of `p1 / 255` of three leases, `0xfc..=0xfd`
    /// [`Fault::Failover`] with a lag of `p1 / 255` of two leases,
    /// `0xfe..=0xff` [`Fault::ClearTable`]. (Before operator faults existed
    /// those eight kinds decoded as `kind % 16`, i.e. a slow link, a failing
    /// database, crashes, a shutdown or resignations; before failovers
    /// existed `0xfc..=0xfd` were restores too.)
    ///
    /// The timing byte's low three bits pick the template; its bit 5 turns
    /// the release feed on ([`Schedule::wakes`]), bits 3-4 set the feed's
    /// loss and bits 6-7 its duplicates ([`WakeFeed`]). (Before the feed
    /// existed those bits were ignored; bit 5 was clear in every fuzz corpus
    /// file committed then, so each still decodes to the run it was.)
    ///
    /// The database clock's caveat: the fence rule `max(previous + 1, now in
    /// microseconds)` issues fences a little ahead of the clock when several
    /// terms start within one microsecond, so a deleted or restored row right
    /// after such a burst could see a fence again. As the acceptance suite
    /// waits 2 ms of database clock before its operator events, the
    /// simulation applies an operator fault only once the database clock
    /// reads [`OPERATOR_CLOCK_WAIT`] past the last fence issued, deferring it
    /// until then if need be.
    pub fn from_bytes(bytes: &[u8], variant: Variant) -> Schedule {
        let mut r = Bytes::new(bytes);
        let n_hosts = 2 + usize::from(r.u8()) % (MAX_HOSTS - 1);
        let t = r.u8();
        let aux = r.u8();
        let wakes = WakeFeed::decode(t & 0x20 != 0, t >> 3, t >> 6);
        let mut timing = timing_template(t, aux);
        if matches!(variant, Variant::AnchorAtReply | Variant::SkewedPastMargin | Variant::JustPastMargin) {
            timing = Timing::default();
        }
        if variant == Variant::NoMarginSkewed {
            timing.safety_margin = Duration::ZERO;
        }
        let (safe_lo, safe_hi) = safe_rate_range(&timing);
        let lease = timing.lease_duration;
        let op = timing.operation_timeout;
        let mut hosts = Vec::with_capacity(n_hosts);
        for i in 0..n_hosts {
            let b = HostBytes::read(&mut r);
            let rate_ppm = match variant {
                Variant::Normal
                | Variant::NoWatchdog
                | Variant::NeverCampaigns
                | Variant::OldFenceRule
                | Variant::NoOperatorClockWait
                | Variant::RenewsLostLease
                | Variant::ClaimsInheritedRows
                | Variant::LeadsOnWake => b.safe_rate((safe_lo, safe_hi)),
                Variant::NoMarginSkewed => 900_000 + 95_000 * u64::from(b.rate) / 255,
                Variant::SkewedPastMargin => 800_000 + 80_000 * u64::from(b.rate) / 255,
                Variant::JustPastMargin => (safe_lo - 20) * (980 + 15 * u64::from(b.rate) / 255) / 1000,
                Variant::AnchorAtReply => PPM,
            };
            // (The just-past-margin control keeps links fast, so that a
            // follower's claim lands inside the small overlap it creates.)
            let link = if variant == Variant::JustPastMargin { op / 40 } else { op / 4 };
            let slow_replies = variant == Variant::AnchorAtReply && i % 2 == 0;
            let start_at = scale(lease * 2, u64::from(b.start), 255);
            let guard_hold = if b.flags & 0x40 != 0 {
                scale(timing.retry_period, u64::from(b.flags & 0x3f) + 1, 64)
            } else {
                Duration::ZERO
            };
            hosts.push(Host { guard_hold, ..b.host(&timing, rate_ppm, link, slow_replies, start_at) });
        }
        let seed = r.u64();
        let horizon = lease * 6;
        let mut faults = Vec::new();
        while r.remaining() > 0 && faults.len() < MAX_FAULTS {
            let (kind, at, target) = fault_head(&mut r, horizon, n_hosts);
            let (p1, p2) = (r.u8(), r.u8());
            let long = p1 == 255 && p2 & 0x0f == 0 && matches!(kind % 16, 0..=4 | 10 | 11);
            let dur = if long {
                // Rarely, hours: time jumps over them.
                Duration::from_secs(3600) + scale(Duration::from_secs(3600), u64::from(p2), 255)
            } else {
                scale(lease * 2, u64::from(p1), 254)
            };
            let fault = match kind {
                // One record in 32: an operator's or a failover's hand.
                OPERATOR_KINDS..=0xfa => Fault::DeleteRow,
                0xfb => Fault::RestoreRow { lag: scale(lease * 3, u64::from(p1), 255) },
                0xfc..=0xfd => Fault::Failover { lag: scale(lease * 2, u64::from(p1), 255) },
                0xfe..=0xff => Fault::ClearTable,
                _ => match kind % 16 {
                    0 | 1 => Fault::PauseDb { dur },
                    2..=4 => Fault::Partition { target, dur },
                    5..=7 => Fault::Lossy { target, dur, req_loss: 20 + p2 % 81, rep_loss: 20 + (p2 / 3) % 81 },
                    8 => Fault::SlowNet { target, dur, extra: scale(op * 3, u64::from(p2), 255) },
                    9 => Fault::DbFailing { dur, fatal: p2 & 1 == 1 },
                    10 | 11 => {
                        Fault::Crash { target, down: if long { dur } else { scale(lease * 2, u64::from(p2), 255) } }
                    }
                    12 => Fault::Shutdown { target, down: scale(lease * 2, u64::from(p2), 255) },
                    _ => Fault::Resign { target },
                },
            };
            faults.push(TimedFault { at, fault });
        }
        Schedule { bytes: bytes.to_vec(), variant, seed, timing, hosts, faults, wakes }
    }

    /// The schedule explored as number `seed`: random bytes from a seeded
    /// generator, decoded by [`Schedule::from_bytes`].
    pub fn from_seed(seed: u64, variant: Variant) -> Schedule {
        let mut rng = SimRng::new(seed ^ 0x005E_ED0F_5C4E_D01E);
        let n_faults = rng.below(13) as usize;
        let len = 3 + 6 * MAX_HOSTS + 8 + 6 * n_faults;
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        // Fault records start after the header, the hosts and the seed; the
        // hosts actually used decide where.
        let n_hosts = 2 + usize::from(bytes[0]) % (MAX_HOSTS - 1);
        bytes.truncate(3 + 6 * n_hosts + 8 + 6 * n_faults);
        Schedule::from_bytes(&bytes, variant)
    }

    /// The slowest clock rate of any host, in ppm.
    pub fn min_rate_ppm(&self) -> u64 {
        min_rate_ppm(&self.hosts)
    }

    /// The longest request delay and round trip of any host with no fault.
    pub fn max_delays(&self) -> (Duration, Duration) {
        max_delays(&self.hosts)
    }

    /// When the last fault's direct effects end: windows close, crashed and
    /// stopped hosts are back, slowed messages have arrived, every host has
    /// started.
    pub fn faults_end(&self) -> Duration {
        let (_, rtt) = self.max_delays();
        let starts = self.hosts.iter().map(|h| h.start_at);
        let faults = self.faults.iter().map(|f| {
            f.at + match f.fault {
                Fault::Crash { down, .. } | Fault::Shutdown { down, .. } => down,
                Fault::Resign { .. } => Duration::ZERO,
                // Applied once the database clock has moved past the last
                // fence issued, normally within this wait.
                Fault::DeleteRow | Fault::RestoreRow { .. } | Fault::ClearTable => OPERATOR_CLOCK_WAIT,
                // The row the replica had may hold the lease for up to a
                // lease more, and the first claim of it re-arms it for a
                // whole lease.
                Fault::Failover { .. } => self.timing.lease_duration * 2,
                _ => f.fault.window().map_or(Duration::ZERO, |(_, length, w)| window_end(length, w, rtt)),
            }
        });
        starts.chain(faults).max().unwrap_or_default()
    }

    /// How soon after [`Schedule::faults_end`] somebody must lead, and keep
    /// leading, with `r` the slowest clock rate, `D` the longest request
    /// delay and `R` the longest round trip:
    ///
    /// ```text
    /// bound = D + lease + (operation_timeout + 1.2 * retry_period + 1 ms) / r + 4 * R
    /// ```
    ///
    /// A lease granted by a request still travelling when the faults end
    /// runs out on the database clock at most `D + lease` later. A call hung
    /// by the faults is abandoned within `operation_timeout / r`, after which
    /// a follower polls at least every `1.2 * retry_period / r` (or when the
    /// observed lease runs out, if that is sooner: that poll claims directly
    /// if the follower saw the holder stall, and otherwise inspects and
    /// claims at once; the 1 ms is slack left from when that poll came 1 ms
    /// late). Then at most a release of a stale fence, an inspect and an
    /// acquire, one round trip each, plus the round trip of the poll itself. Hosts whose programs
    /// keep guards after a term ends ([`Host::guard_hold`]) add the longest
    /// hold to the local part.
    pub fn liveness_bound(&self) -> Duration {
        let t = &self.timing;
        let (d, rtt) = self.max_delays();
        let r = self.min_rate_ppm();
        let hold = self.hosts.iter().map(|h| h.guard_hold).max().unwrap_or_default();
        let local = t.operation_timeout + scale(t.retry_period, 6, 5) + Duration::from_millis(1) + hold;
        d + t.lease_duration + scale(local, PPM, r) + rtt * 4
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.timing;
        let wakes = match self.wakes {
            Some(w) => format!(", wakes on release (lost {} %, doubled {} %)", w.loss, w.dup),
            None => String::new(),
        };
        writeln!(
            f,
            "variant {}, {} hosts{wakes}, lease {:?} renew {:?} retry {:?} op-timeout {:?} margin {:?}",
            self.variant.name(),
            self.hosts.len(),
            t.lease_duration,
            t.renew_interval,
            t.retry_period,
            t.operation_timeout,
            t.safety_margin
        )?;
        for (i, h) in self.hosts.iter().enumerate() {
            let hold = if h.guard_hold.is_zero() { String::new() } else { format!(" holds guards {:?}", h.guard_hold) };
            writeln!(f, "  host {i}: {h}{}{hold}", if h.release_on_shutdown { "" } else { " no-release" })?;
        }
        for fault in &self.faults {
            writeln!(f, "  at {:?}: {:?}", fault.at, fault.fault)?;
        }
        Ok(())
    }
}

/// Lower-case hex of `bytes`, for replay commands.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses [`to_hex`]'s output (whitespace ignored).
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    digits.chunks(2).map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()).collect()
}

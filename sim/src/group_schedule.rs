//! A group fleet's schedule, decoded from a byte string so that a fuzzer
//! can drive it, and generated from a seed for ordinary exploration.

use std::fmt;
use std::time::Duration;

use super::rng::{scale, Bytes, SimRng};
use super::schedule::{
    fault_head, max_delays, min_rate_ppm, safe_rate_range, timing_template_for, Host, HostBytes, Target, WakeFeed, PPM,
};
use crate::fleet::{window_end, Window, Windowed};
use leaderelection::group::core::default_tick;
use leaderelection::{Config, GroupConfig, MemStore, Timing};

/// The most participants (processes at once) a group schedule has.
pub const MAX_PARTICIPANTS: usize = 5;

/// The fewest and the most elections every participant runs.
pub const MIN_ELECTIONS: usize = 10;
/// See [`MIN_ELECTIONS`].
pub const MAX_ELECTIONS: usize = 200;

/// The most faults decoded from one byte string.
pub const MAX_GROUP_FAULTS: usize = 16;

/// Bytes before the participants: count, timing template, its parameter,
/// elections, flags.
pub const GROUP_HEADER: usize = 5;
/// Bytes per participant.
pub const PARTICIPANT_BYTES: usize = 6;
/// Bytes per fault record: kind, at (u16), who, p1, p2, p3.
pub const FAULT_BYTES: usize = 7;

/// How the group fleet is driven: the production driver, or a broken one
/// used as a negative control.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupVariant {
    /// The production rules: timings that pass [`GroupConfig::validate`],
    /// clock rates within what the safety margin absorbs, the driver loop of
    /// [`leaderelection::group::core`]'s docs.
    Normal,
    /// **Broken on purpose.** Every machine anchors its deadlines at the
    /// reply ([`GroupMachineConfig::unsafe_anchor_at_reply`](leaderelection::group::core::GroupMachineConfig)),
    /// with the default timings, clocks at the database's rate and replies
    /// to even participants slower than the safety margin (inside the
    /// operation timeout), as the single-election simulation's control.
    AnchorAtReply,
    /// **Broken on purpose.** The participants run without the fair share
    /// while the oracle checks it (on schedules whose bytes ask for it):
    /// whoever looks first claims every free election.
    FairShareOff,
    /// **Broken on purpose.** A driver that hands a batch's answers to the
    /// wrong elections: rotated by one (the first entry gets the last
    /// answer). A claim that failed for one election is answered with
    /// another's success.
    RotatedAnswers,
    /// **Broken on purpose.** Every participant heartbeats under the same
    /// member name (an identity without its instance tag): each counts one
    /// live member and claims every election.
    SharedMemberName,
    /// **Broken on purpose.** A driver that never sends the members
    /// heartbeat: with a fair share nobody's count is ever fresh, so nobody
    /// claims. Safe and useless; the liveness property must catch it.
    DropsHeartbeats,
    /// **A driver mistake the core must absorb** (not a control: it must
    /// pass). Every batch's answer is delivered a second time, after the
    /// batch's operation timeout and a tick, and handed to the core as if
    /// fresh: the core has given the batch up by then, and its machines
    /// the calls, so the second delivery changes nothing.
    ReplaysLateAnswers,
    /// **Broken on purpose.** A woken follower leads at once under the next
    /// fence instead of claiming ([`GroupMachineConfig::unsafe_lead_on_wake`](leaderelection::group::core::GroupMachineConfig)):
    /// it takes an election the release feed names without asking the
    /// database. Only schedules with the feed on can reach it.
    LeadsOnWake,
}

impl GroupVariant {
    /// Every variant, the production one first.
    pub const ALL: [GroupVariant; 8] = [
        GroupVariant::Normal,
        GroupVariant::AnchorAtReply,
        GroupVariant::FairShareOff,
        GroupVariant::RotatedAnswers,
        GroupVariant::SharedMemberName,
        GroupVariant::DropsHeartbeats,
        GroupVariant::ReplaysLateAnswers,
        GroupVariant::LeadsOnWake,
    ];

    /// The name used in replay commands (`SIM_GROUP_VARIANT=...`).
    pub fn name(self) -> &'static str {
        match self {
            GroupVariant::Normal => "normal",
            GroupVariant::AnchorAtReply => "anchor-at-reply",
            GroupVariant::FairShareOff => "fair-share-off",
            GroupVariant::RotatedAnswers => "rotated-answers",
            GroupVariant::SharedMemberName => "shared-member-name",
            GroupVariant::DropsHeartbeats => "drops-heartbeats",
            GroupVariant::ReplaysLateAnswers => "replays-late-answers",
            GroupVariant::LeadsOnWake => "leads-on-wake",
        }
    }

    /// The variant called `name`.
    pub fn from_name(name: &str) -> Option<GroupVariant> {
        GroupVariant::ALL.into_iter().find(|v| v.name() == name)
    }
}

/// One participant's host: the one-election [`Host`] (its clock, its
/// network), with its grid's [`Host::phase`]; its first process may start
/// late (up to six leases in), and its `guard_hold` is zero.
pub type Participant = Host;

/// Which participant a fault hits: the one-election [`Target`], where
/// [`Target::Leader`] is the process leading the most elections when the
/// fault starts (host 0 if nobody leads).
pub type GroupTarget = Target;

/// What goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupFault {
    /// The database stops answering: requests wait and are applied in
    /// order when it resumes.
    PauseDb {
        /// For how long.
        dur: Duration,
    },
    /// Every message to or from the participant is lost.
    Partition {
        /// Who.
        target: GroupTarget,
        /// For how long.
        dur: Duration,
    },
    /// Some requests are lost (never applied), some replies are lost (the
    /// write lands, no answer comes).
    Lossy {
        /// Who.
        target: GroupTarget,
        /// For how long.
        dur: Duration,
        /// Percentage of requests lost.
        req_loss: u8,
        /// Percentage of replies lost.
        rep_loss: u8,
    },
    /// Messages take `extra` longer, possibly past the operation timeout.
    SlowNet {
        /// Who.
        target: GroupTarget,
        /// For how long.
        dur: Duration,
        /// Added to every delay.
        extra: Duration,
    },
    /// Every statement fails at once (every item of every batch, and the
    /// heartbeat).
    DbFailing {
        /// For how long.
        dur: Duration,
        /// Fatal rather than retryable.
        fatal: bool,
    },
    /// SIGKILL: the process is gone, its leases and its member row stay
    /// until they expire. A fresh process (new identity) starts after
    /// `down`, unless `permanent` (and another participant remains).
    Kill {
        /// Who.
        target: GroupTarget,
        /// Downtime before the fresh process.
        down: Duration,
        /// The host never comes back.
        permanent: bool,
    },
    /// A clean shutdown: every election leaves (releasing, if the host's
    /// processes release), then the member leaves. A fresh process starts
    /// after `down`, unless `permanent` (and another participant remains).
    Shutdown {
        /// Who.
        target: GroupTarget,
        /// Downtime before the fresh process.
        down: Duration,
        /// The host never comes back.
        permanent: bool,
    },
    /// `count` elections of the participant, from `first` on, leave
    /// ([`GroupMachine::leave`](leaderelection::group::core::GroupMachine::leave))
    /// and join again `after` later (once each has stopped).
    LeaveRejoin {
        /// Who.
        target: GroupTarget,
        /// The first election (wrapping).
        first: usize,
        /// How many.
        count: usize,
        /// Whether the leave releases the leases.
        release: bool,
        /// How long until they join again.
        after: Duration,
        /// How many of the process's renewal batches are held in transit
        /// before the leave (which then waits `stuck` renew intervals): each
        /// reaches the database just before the lease in force expires,
        /// after the leave, and its answer comes too late. 0 to 3.
        stuck: usize,
    },
    /// The program drops the guards of up to `count` of the terms the
    /// participant leads (the lowest-numbered elections first): it resigns
    /// them.
    Resign {
        /// Who.
        target: GroupTarget,
        /// How many.
        count: usize,
    },
}

impl Windowed for GroupFault {
    fn window(&self) -> Option<(Option<Target>, Duration, Window)> {
        Some(match *self {
            GroupFault::PauseDb { dur } => (None, dur, Window::PauseDb),
            GroupFault::DbFailing { dur, fatal } => (None, dur, Window::DbFailing { fatal }),
            GroupFault::Partition { target, dur } => (Some(target), dur, Window::Partition),
            GroupFault::Lossy { target, dur, req_loss, rep_loss } => {
                (Some(target), dur, Window::Lossy { req_loss, rep_loss })
            }
            GroupFault::SlowNet { target, dur, extra } => (Some(target), dur, Window::SlowNet { extra }),
            _ => return None,
        })
    }
}

/// A fault and when it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupTimedFault {
    /// Virtual time since the start of the run.
    pub at: Duration,
    /// What happens.
    pub fault: GroupFault,
}

/// Everything one simulated group run depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSchedule {
    /// The bytes it was decoded from.
    pub bytes: Vec<u8>,
    /// The variant applied on top of the bytes.
    pub variant: GroupVariant,
    /// Seeds message delays, loss, identities and the machines' seeds.
    pub seed: u64,
    /// The durations every election runs with.
    pub timing: Timing,
    /// The grid step ([`default_tick`] of the timing).
    pub tick: Duration,
    /// Elections every participant runs (10 to 200).
    pub elections: usize,
    /// Whether the group runs with a fair share (and the oracle checks it).
    pub fair_share: bool,
    /// The participants' hosts (2 to 5).
    pub participants: Vec<Participant>,
    /// The faults, in the order decoded.
    pub faults: Vec<GroupTimedFault>,
    /// The release feed, if the participants have one: a release batch's
    /// released elections wake the other members' machines
    /// ([`GroupMachine::handle_wakes`](leaderelection::group::core::GroupMachine::handle_wakes));
    /// `None`, they learn of releases at their next looks.
    pub wakes: Option<WakeFeed>,
}

/// Whether `timing` passes [`GroupConfig::validate`] with the default tick:
/// the timing invariant with the tick added.
pub fn valid_for_group(timing: &Timing) -> bool {
    timing.validate().is_ok() && GroupConfig::new(Config::new(MemStore::new(), "g").timing(*timing)).validate().is_ok()
}

fn timing_template(t: u8, aux: u8) -> Timing {
    // Exactly on the group's timing invariant: 5 + 2*3 + 1.25 + 0.5 = 14.25 - 1.5.
    let ms = Duration::from_millis;
    let on_boundary = Timing { lease_duration: ms(14_250), safety_margin: ms(1_500), ..Timing::default() };
    timing_template_for(t, aux, on_boundary, valid_for_group)
}

impl GroupSchedule {
    /// Decodes `bytes`. Every byte string decodes to a schedule: missing
    /// bytes read as zero, extra bytes are ignored.
    ///
    /// The layout: five header bytes (participants, timing template, its
    /// parameter, elections, flags: bit 0 the fair share, bit 1 the release
    /// feed, bits 2-3 its loss and 4-5 its duplicates, see [`WakeFeed`]),
    /// six bytes per
    /// participant (rate, clock offset, request delay, reply delay, start,
    /// flags: bit 7 no release, bits 0-6 the grid's phase), an eight-byte
    /// seed, then seven-byte fault records `kind, at (u16), who, p1, p2,
    /// p3`; `kind % 16` picks the fault, `who` the target (128 and up:
    /// whoever leads most).
    pub fn from_bytes(bytes: &[u8], variant: GroupVariant) -> GroupSchedule {
        let mut r = Bytes::new(bytes);
        let n = 2 + usize::from(r.u8()) % (MAX_PARTICIPANTS - 1);
        let (t, aux) = (r.u8(), r.u8());
        let elections = MIN_ELECTIONS + usize::from(r.u8()) * (MAX_ELECTIONS - MIN_ELECTIONS) / 255;
        let flags = r.u8();
        let fair_share = flags & 1 == 1;
        let wakes = WakeFeed::decode(flags & 2 != 0, flags >> 2, flags >> 4);
        let mut timing = timing_template(t, aux);
        if variant == GroupVariant::AnchorAtReply {
            timing = Timing::default();
        }
        let tick = default_tick(&timing);
        let (safe_lo, safe_hi) = safe_rate_range(&timing);
        let lease = timing.lease_duration;
        let op = timing.operation_timeout;
        let mut participants = Vec::with_capacity(n);
        for i in 0..n {
            let b = HostBytes::read(&mut r);
            let anchor = variant == GroupVariant::AnchorAtReply;
            let rate_ppm = if anchor { PPM } else { b.safe_rate((safe_lo, safe_hi)) };
            // Three in four start within a lease; the rest join late, two
            // to six leases in, after the others have settled.
            let start_at = if b.start < 192 {
                scale(lease, u64::from(b.start), 192)
            } else {
                lease * 2 + scale(lease * 4, u64::from(b.start - 192), 63)
            };
            let phase = scale(tick, u64::from(b.flags & 0x7f), 128);
            participants
                .push(Participant { phase, ..b.host(&timing, rate_ppm, op / 4, anchor && i % 2 == 0, start_at) });
        }
        let seed = r.u64();
        let horizon = lease * 6;
        let mut faults = Vec::new();
        while r.remaining() > 0 && faults.len() < MAX_GROUP_FAULTS {
            let (kind, at, target) = fault_head(&mut r, horizon, n);
            let (p1, p2, p3) = (r.u8(), r.u8(), r.u8());
            let dur = scale(lease * 2, u64::from(p1), 254);
            let down = scale(lease * 2, u64::from(p2), 255);
            let fault = match kind % 16 {
                0 | 1 => GroupFault::PauseDb { dur },
                2 | 3 => GroupFault::Partition { target, dur },
                4 | 5 => GroupFault::Lossy { target, dur, req_loss: 20 + p2 % 81, rep_loss: 20 + p3 % 81 },
                6 => GroupFault::SlowNet { target, dur, extra: scale(op * 3, u64::from(p2), 255) },
                7 => GroupFault::DbFailing { dur, fatal: p2 & 1 == 1 },
                8 | 9 | 14 => GroupFault::Kill { target, down, permanent: p3 & 3 == 0 },
                10 => GroupFault::Shutdown { target, down, permanent: p3 & 3 == 0 },
                11 | 12 | 15 => {
                    let stuck = usize::from(kind >> 4) % 4;
                    // Held renewals keep the old leases live for up to
                    // `stuck` leases more: join again within that too.
                    let most = lease * (2 + 2 * u32::from(stuck > 0));
                    GroupFault::LeaveRejoin {
                        target,
                        first: usize::from(p1) * elections / 256,
                        count: 1 + usize::from(p2 & 0x7f) * elections / 128,
                        release: p2 & 0x80 == 0,
                        after: scale(most, u64::from(p3), 255),
                        stuck,
                    }
                }
                _ => GroupFault::Resign { target, count: 1 + usize::from(p2 % 32) },
            };
            faults.push(GroupTimedFault { at, fault });
        }
        GroupSchedule {
            bytes: bytes.to_vec(),
            variant,
            seed,
            timing,
            tick,
            elections,
            fair_share,
            participants,
            faults,
            wakes,
        }
    }

    /// The schedule explored as number `seed`: random bytes from a seeded
    /// generator, decoded by [`GroupSchedule::from_bytes`].
    pub fn from_seed(seed: u64, variant: GroupVariant) -> GroupSchedule {
        let mut rng = SimRng::new(seed ^ 0x0067_5250_5EED_0001);
        let n_faults = rng.below(11) as usize;
        let len = GROUP_HEADER + PARTICIPANT_BYTES * MAX_PARTICIPANTS + 8 + FAULT_BYTES * n_faults;
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let n = 2 + usize::from(bytes[0]) % (MAX_PARTICIPANTS - 1);
        // The seed and the fault records follow the participants used.
        bytes.drain(GROUP_HEADER + PARTICIPANT_BYTES * n..GROUP_HEADER + PARTICIPANT_BYTES * MAX_PARTICIPANTS);
        GroupSchedule::from_bytes(&bytes, variant)
    }

    /// The slowest clock rate of any participant, in ppm.
    pub fn min_rate_ppm(&self) -> u64 {
        min_rate_ppm(&self.participants)
    }

    /// The longest request delay and round trip of any participant with no
    /// fault.
    pub fn max_delays(&self) -> (Duration, Duration) {
        max_delays(&self.participants)
    }

    /// `d` of local time on the slowest clock, in real time.
    pub fn on_slowest_clock(&self, d: Duration) -> Duration {
        scale(d, PPM, self.min_rate_ppm())
    }

    /// How long an election's leave, or a participant's clean shutdown,
    /// may take on the slowest clock: each waits for a claim or renewal in
    /// flight, then for its release, each up to an operation timeout
    /// noticed up to a tick late; a shutdown with a fair share then waits
    /// for the member's leave call, likewise.
    pub fn stop_bound(&self, shutdown: bool) -> Duration {
        let step = self.timing.operation_timeout + self.tick;
        let steps = if shutdown && self.fair_share { 3 } else { 2 };
        self.on_slowest_clock(step * steps) + Duration::from_micros(1)
    }

    /// When the last fault's direct effects end: windows close, killed and
    /// stopped hosts are back (or would be, if not permanent), elections
    /// that left have joined again, slowed messages have arrived, every
    /// participant has started.
    pub fn faults_end(&self) -> Duration {
        let (_, rtt) = self.max_delays();
        let starts = self.participants.iter().map(|h| h.start_at);
        let faults = self.faults.iter().map(|f| {
            f.at + match f.fault {
                GroupFault::Kill { down, .. } => down,
                GroupFault::Shutdown { down, .. } => down.max(self.stop_bound(true)),
                // A leave still under way when the time to join again comes
                // joins once it has stopped.
                GroupFault::LeaveRejoin { after, stuck, .. } => {
                    self.timing.renew_interval * stuck as u32
                        + after.max(self.stop_bound(false))
                        + self.timing.lease_duration * stuck as u32
                }
                GroupFault::Resign { .. } => Duration::ZERO,
                _ => f.fault.window().map_or(Duration::ZERO, |(_, length, w)| window_end(length, w, rtt)),
            }
        });
        starts.chain(faults).max().unwrap_or_default()
    }

    /// How soon after [`GroupSchedule::faults_end`] every election must be
    /// led, and stay led, with `r` the slowest clock rate, `D` the longest
    /// request delay, `R` the longest round trip and `T` the tick:
    ///
    /// ```text
    /// bound = D + lease + (operation_timeout + retry_period + 3 T + 1 ms) / r + 4 R
    ///       [ + (max(renew_interval, operation_timeout) + T) / r + R   with a fair share ]
    /// ```
    ///
    /// The single-election bound's argument, on the grid: a lease granted
    /// by a request in flight when the faults end (or left by a killed
    /// participant) runs out on the database clock within `D + lease`; a
    /// call hung by the faults is given up within the operation timeout,
    /// noticed at the next grid instant (`T`); followers look every retry
    /// period exactly (no jitter in a group), up to a tick late (`T`), or
    /// at the observed lease's expiry, where a stalled holder's lease is
    /// claimed at the first grid instant after it (`T`); then a release of
    /// a stale fence, a look and a claim, one round trip each, plus the
    /// round trip of the poll. With a fair share a participant claims only
    /// on a fresh count: a heartbeat goes every renew interval (after one
    /// in flight has timed out), up to a tick late, and its answer takes a
    /// round trip; by then a dead member's heartbeat row has expired like
    /// its leases, so the survivors' shares cover every election.
    pub fn liveness_bound(&self) -> Duration {
        let t = &self.timing;
        let (d, rtt) = self.max_delays();
        let tick = self.tick;
        let local = t.operation_timeout + t.retry_period + tick * 3 + Duration::from_millis(1);
        let mut bound = d + t.lease_duration + self.on_slowest_clock(local) + rtt * 4;
        if self.fair_share {
            bound += self.on_slowest_clock(t.renew_interval.max(t.operation_timeout) + tick) + rtt;
        }
        bound
    }

    /// With a fair share, the longest an election may go unled when a
    /// member sheds its term after the faults (a hand-over of the share):
    /// the release travels (`D`), the member under its share looks within
    /// a retry period (up to a tick early or late), its claim and answer
    /// take round trips:
    ///
    /// ```text
    /// D + (retry_period + operation_timeout + 2 T + 1 ms) / r + 3 R
    /// ```
    pub fn handover_bound(&self) -> Duration {
        let t = &self.timing;
        let (d, rtt) = self.max_delays();
        let local = t.retry_period + t.operation_timeout + self.tick * 2 + Duration::from_millis(1);
        d + self.on_slowest_clock(local) + rtt * 3
    }

    /// With a fair share, how soon after [`GroupSchedule::faults_end`] no
    /// live participant may lead more than `ceil(elections / live)`:
    ///
    /// ```text
    /// allowance = D + lease + (max(renew_interval, operation_timeout) + renew_interval
    ///                          + operation_timeout + 3 T + 1 ms) / r + 2 R
    /// ```
    ///
    /// By `D + lease` every dead member's heartbeat row has expired (each
    /// heartbeat lives a lease) and every live member's is written, so the
    /// count on the database is the number of live participants from then
    /// on. A participant sheds its surplus once it has seen that count
    /// twice in a row: its next heartbeat goes within
    /// `max(renew_interval, operation_timeout) + T` (one in flight may
    /// first have to time out), the one after within `renew_interval + T`,
    /// each answered within `R`, and the resignations end the surplus terms
    /// at once. A claim it sent under the larger share before may still be
    /// answered within an operation timeout, and is shed at the next grid
    /// instant (`T`). Two heartbeat intervals and a retry period would do
    /// without dead members; with them the lease is needed, since every
    /// change of the count restarts the "seen twice" rule.
    ///
    /// A term the share's starvation valve claimed beyond the share (an
    /// election seen unled for a whole lease, which faults can cause while
    /// some member is under its share) is kept
    /// [`BEYOND_SHARE_KEPT`](leaderelection::group::core::BEYOND_SHARE_KEPT)
    /// leases and then shed like any other. Such a claim goes at the latest
    /// once the election has been unled a lease after the liveness bound's
    /// leases expired, so the allowance is also at least
    ///
    /// ```text
    /// D + lease + (lease * (1 + BEYOND_SHARE_KEPT) + retry_period + operation_timeout + 3 T + 1 ms) / r + 2 R
    /// ```
    pub fn fairness_allowance(&self) -> Duration {
        let t = &self.timing;
        let (d, rtt) = self.max_delays();
        let local = t.renew_interval.max(t.operation_timeout)
            + t.renew_interval
            + t.operation_timeout
            + self.tick * 3
            + Duration::from_millis(1);
        let counted = d + t.lease_duration + self.on_slowest_clock(local) + rtt * 2;
        let kept = leaderelection::group::core::BEYOND_SHARE_KEPT;
        let valve = t.lease_duration.saturating_mul(1 + kept)
            + t.retry_period
            + t.operation_timeout
            + self.tick * 3
            + Duration::from_millis(1);
        counted.max(d + t.lease_duration + self.on_slowest_clock(valve) + rtt * 2)
    }
}

impl fmt::Display for GroupSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.timing;
        writeln!(
            f,
            "variant {}, {} participants, {} elections{}{}, lease {:?} renew {:?} retry {:?} op-timeout {:?} \
             margin {:?} tick {:?}",
            self.variant.name(),
            self.participants.len(),
            self.elections,
            if self.fair_share { ", fair share" } else { "" },
            match self.wakes {
                Some(w) => format!(", wakes on release (lost {} %, doubled {} %)", w.loss, w.dup),
                None => String::new(),
            },
            t.lease_duration,
            t.renew_interval,
            t.retry_period,
            t.operation_timeout,
            t.safety_margin,
            self.tick
        )?;
        for (i, h) in self.participants.iter().enumerate() {
            let release = if h.release_on_shutdown { "" } else { " no-release" };
            writeln!(f, "  host {i}: {h} phase {:?}{release}", h.phase)?;
        }
        for fault in &self.faults {
            writeln!(f, "  at {:?}: {:?}", fault.at, fault.fault)?;
        }
        Ok(())
    }
}

//! The judge of a fleet's terms, election by election: each term is an
//! interval on the machine's monotonic clock that covers every instant at
//! which its worker counted it valid (see the suite's docs for how each
//! end of it is bounded), and the judge checks, per election:
//! 1. no two terms overlap (two workers' terms, or one worker's
//!    consecutive ones);
//! 2. fences strictly increase from term to term in start order (terms
//!    that do not overlap are ordered by their intervals);
//! 3. no two terms share a fence;
//! 4. every term has ended (a live worker reports its end; a killed
//!    worker's terms end at the kill).
//!
//! It also gives the figures of a stretch of time: how long each election
//! went without a term, and how many terms started.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// How a term ended: the bound on its end, which one it was, and when its
/// worker first saw it over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TermEnd {
    pub at: u64,
    pub how: String,
    pub seen: u64,
}

/// One term as its worker reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    pub worker: usize,
    pub election: usize,
    pub fence: u64,
    /// At or before the term's first valid instant.
    pub start: u64,
    /// At or after its last valid instant; `None` while it runs.
    pub end: Option<TermEnd>,
    pub start_how: String,
}

impl Term {
    fn who(&self) -> (usize, u64) {
        (self.worker, self.fence)
    }

    /// The end, or `open` for a term still running.
    fn end_or(&self, open: u64) -> u64 {
        self.end.as_ref().map_or(open, |e| e.at)
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "e{:04} w{} fence {} from {} ({})",
            self.election, self.worker, self.fence, self.start, self.start_how
        )?;
        match &self.end {
            Some(e) => write!(f, " to {} ({}, seen over at {})", e.at, e.how, e.seen),
            None => f.write_str(" (open)"),
        }
    }
}

/// A broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Two terms of one election were valid at once, from `from` to `to`.
    Overlap { election: usize, first: (usize, u64), second: (usize, u64), from: u64, to: u64 },
    /// A term started after another without a higher fence.
    FenceNotIncreasing { election: usize, earlier: (usize, u64), later: (usize, u64) },
    /// Two terms with one fence.
    SharedFence { election: usize, fence: u64, workers: (usize, usize) },
    /// A term whose end was never reported.
    Open { election: usize, term: (usize, u64) },
    /// A rule a worker saw broken (see the worker's checks).
    Reported(String),
}

impl Violation {
    /// The workers the violation is about.
    pub fn workers(&self) -> Vec<usize> {
        match self {
            Violation::Overlap { first, second, .. } => vec![first.0, second.0],
            Violation::FenceNotIncreasing { earlier, later, .. } => vec![earlier.0, later.0],
            Violation::SharedFence { workers, .. } => vec![workers.0, workers.1],
            Violation::Open { term, .. } => vec![term.0],
            Violation::Reported(_) => vec![],
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap { election, first, second, from, to } => write!(
                f,
                "overlap in e{election:04}: w{}#{} and w{}#{} both valid for {:.3} ms (from {from} to {to})",
                first.0,
                first.1,
                second.0,
                second.1,
                (to - from) as f64 / 1e6
            ),
            Violation::FenceNotIncreasing { election, earlier, later } => write!(
                f,
                "fence not increasing in e{election:04}: w{}#{} started after w{}#{}",
                later.0, later.1, earlier.0, earlier.1
            ),
            Violation::SharedFence { election, fence, workers } => {
                write!(f, "shared fence in e{election:04}: w{} and w{} both had fence {fence}", workers.0, workers.1)
            }
            Violation::Open { election, term } => {
                write!(f, "e{election:04}: the end of w{}#{} was never reported", term.0, term.1)
            }
            Violation::Reported(s) => write!(f, "reported by {s}"),
        }
    }
}

/// The figures of a run that passed.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub terms: usize,
    pub elections: usize,
    /// How many ends were bounded each way.
    pub ends: BTreeMap<String, usize>,
    /// The smallest gap between one term's end bound and the next term's
    /// start, in nanoseconds: how close the tightest hand-over came.
    pub closest: Option<u64>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ends: Vec<String> = self.ends.iter().map(|(k, v)| format!("{k}×{v}")).collect();
        write!(
            f,
            "{} terms in {} elections, no overlap, fences rising; ends bounded by {}; closest hand-over {}",
            self.terms,
            self.elections,
            ends.join(" "),
            self.closest.map_or("-".to_owned(), |g| format!("{:.1} ms", g as f64 / 1e6))
        )
    }
}

/// Judges `terms` (see the module docs), with `reported`: the violations
/// the workers saw.
pub fn judge(terms: &[Term], reported: &[String]) -> Result<Report, Vec<Violation>> {
    let mut v: Vec<Violation> = reported.iter().map(|s| Violation::Reported(s.clone())).collect();
    let mut by_election: BTreeMap<usize, Vec<&Term>> = BTreeMap::new();
    for t in terms {
        by_election.entry(t.election).or_default().push(t);
    }
    let mut ends: BTreeMap<String, usize> = BTreeMap::new();
    let mut closest: Option<u64> = None;
    for (&e, list) in &mut by_election {
        list.sort_by_key(|t| (t.start, t.fence));
        let mut fences: HashMap<u64, usize> = HashMap::new();
        // The term reaching furthest so far.
        let mut reach: Option<&Term> = None;
        for (k, t) in list.iter().enumerate() {
            match &t.end {
                Some(end) => *ends.entry(end.how.clone()).or_default() += 1,
                None => v.push(Violation::Open { election: e, term: t.who() }),
            }
            if let Some(w) = fences.insert(t.fence, t.worker) {
                v.push(Violation::SharedFence { election: e, fence: t.fence, workers: (w, t.worker) });
            }
            if k > 0 {
                let prev = list[k - 1];
                if t.fence <= prev.fence {
                    v.push(Violation::FenceNotIncreasing { election: e, earlier: prev.who(), later: t.who() });
                }
            }
            if let Some(r) = reach {
                let r_end = r.end_or(u64::MAX);
                if t.start < r_end {
                    let to = r_end.min(t.end_or(u64::MAX));
                    v.push(Violation::Overlap { election: e, first: r.who(), second: t.who(), from: t.start, to });
                } else {
                    let gap = t.start - r_end;
                    closest = Some(closest.map_or(gap, |c| c.min(gap)));
                }
            }
            if reach.is_none_or(|r| t.end_or(u64::MAX) > r.end_or(u64::MAX)) {
                reach = Some(t);
            }
        }
    }
    if v.is_empty() {
        Ok(Report { terms: terms.len(), elections: by_election.len(), ends, closest })
    } else {
        Err(v)
    }
}

/// For each of `elections` elections, how long within `[from, to]` it had
/// no term (terms still open count as running to `to`).
pub fn leaderless(terms: &[Term], elections: usize, from: u64, to: u64) -> Vec<u64> {
    let mut spans: Vec<Vec<(u64, u64)>> = vec![Vec::new(); elections];
    for t in terms {
        let (a, b) = (t.start.max(from), t.end_or(to).min(to));
        if a < b && t.election < elections {
            spans[t.election].push((a, b));
        }
    }
    spans
        .into_iter()
        .map(|mut s| {
            s.sort_unstable();
            let mut covered = 0;
            let mut cur: Option<(u64, u64)> = None;
            for (a, b) in s {
                match cur {
                    Some((ca, cb)) if a <= cb => cur = Some((ca, cb.max(b))),
                    Some((ca, cb)) => {
                        covered += cb - ca;
                        cur = Some((a, b));
                    }
                    None => cur = Some((a, b)),
                }
            }
            if let Some((ca, cb)) = cur {
                covered += cb - ca;
            }
            (to - from).saturating_sub(covered)
        })
        .collect()
}

/// The `q`-quantile (0..=1) of `values`, by rank.
pub fn quantile(values: &[u64], q: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    let k = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[k]
}

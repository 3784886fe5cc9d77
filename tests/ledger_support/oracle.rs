//! The ledger's judge. Every committed row carries its term's fence and a
//! stamp from the one-row clock that each transaction bumps as its last
//! statement before `COMMIT`; the clock's row lock is held to the end of
//! the transaction, so stamp order is commit order (a rolled-back
//! transaction leaves a gap, never a row). In that order:
//!
//! 1. fences never decrease ([`Violation::FenceDecrease`]);
//! 2. no row of a term commits after the first row of the next term that
//!    wrote any ([`Violation::LateRow`]);
//! 3. one fence, one writer ([`Violation::SharedFence`]): two workers never
//!    wrote under the same term.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One committed ledger row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub stamp: i64,
    pub fence: i64,
    pub worker: String,
    pub seq: i64,
}

/// A broken rule of the ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// A row committed with a fence below one committed before it.
    FenceDecrease { row: Row, after_fence: i64 },
    /// A row of a term committed after the first row of the next term.
    LateRow { row: Row, next_fence: i64, next_first_stamp: i64 },
    /// Two workers wrote rows under one fence.
    SharedFence { fence: i64, workers: (String, String) },
}

impl Violation {
    /// The row the violation is about, if one.
    pub fn row(&self) -> Option<&Row> {
        match self {
            Violation::FenceDecrease { row, .. } | Violation::LateRow { row, .. } => Some(row),
            Violation::SharedFence { .. } => None,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::FenceDecrease { row, after_fence } => write!(
                f,
                "fence decreased in commit order: row {} (fence {}, {} seq {}) committed after a row of fence {after_fence}",
                row.stamp, row.fence, row.worker, row.seq
            ),
            Violation::LateRow { row, next_fence, next_first_stamp } => write!(
                f,
                "late row: row {} of term {} ({} seq {}) committed after row {next_first_stamp}, the first of the next \
                 term {next_fence}",
                row.stamp, row.fence, row.worker, row.seq
            ),
            Violation::SharedFence { fence, workers } => {
                write!(f, "fence {fence} was written by both {} and {}", workers.0, workers.1)
            }
        }
    }
}

/// What a clean ledger held.
#[derive(Clone, Debug)]
pub struct Report {
    pub rows: usize,
    /// Each term that wrote, in fence order: fence, worker, rows.
    pub terms: Vec<(i64, String, usize)>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} rows in {} terms:", self.rows, self.terms.len())?;
        for (fence, worker, n) in &self.terms {
            write!(f, " {worker}@{fence}×{n}")?;
        }
        Ok(())
    }
}

/// Judges the committed rows (any order: they are sorted by stamp here).
pub fn judge(rows: &[Row]) -> Result<Report, Vec<Violation>> {
    let mut rows = rows.to_vec();
    rows.sort_by_key(|r| r.stamp);
    let mut v = Vec::new();
    // 1. Monotone fences in commit order.
    let mut max: Option<i64> = None;
    for r in &rows {
        if let Some(m) = max.filter(|&m| r.fence < m) {
            v.push(Violation::FenceDecrease { row: r.clone(), after_fence: m });
        }
        max = Some(max.map_or(r.fence, |m| m.max(r.fence)));
    }
    // 2. No row of a term after the next term's first row.
    let mut first: BTreeMap<i64, i64> = BTreeMap::new();
    let mut writers: BTreeMap<i64, BTreeSet<String>> = BTreeMap::new();
    let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
    for r in &rows {
        first.entry(r.fence).or_insert(r.stamp);
        writers.entry(r.fence).or_default().insert(r.worker.clone());
        *counts.entry(r.fence).or_default() += 1;
    }
    for r in &rows {
        if let Some((&next_fence, &next_first_stamp)) = first.range(r.fence + 1..).next() {
            if r.stamp > next_first_stamp {
                v.push(Violation::LateRow { row: r.clone(), next_fence, next_first_stamp });
            }
        }
    }
    // 3. One writer per fence.
    for (&fence, ws) in &writers {
        let mut it = ws.iter();
        if let (Some(a), Some(b)) = (it.next(), it.next()) {
            v.push(Violation::SharedFence { fence, workers: (a.clone(), b.clone()) });
        }
    }
    if !v.is_empty() {
        return Err(v);
    }
    let terms = counts.iter().map(|(&fence, &n)| (fence, writers[&fence].iter().next().unwrap().clone(), n)).collect();
    Ok(Report { rows: rows.len(), terms })
}

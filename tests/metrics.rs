//! Feature `metrics`: the elector's figures through the `metrics` facade,
//! caught by a small recorder written here. Each test installs its own
//! recorder with `with_local_recorder` around `Elector::start`, which is
//! where the elector registers its handles; its threads then use them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leaderelection::{Config, Elector, ErrorKind, MemStore, Status};
use metrics::{Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, SharedString, Unit};

mod threaded;
use threaded::{lead, term_ends, timing, until};

/// Every value a series was given, in order: the increments of a counter,
/// the settings of a gauge, the samples of a histogram.
#[derive(Default)]
struct Series(Mutex<Vec<f64>>);

impl Series {
    fn push(&self, v: f64) {
        self.0.lock().unwrap().push(v);
    }
    fn values(&self) -> Vec<f64> {
        self.0.lock().unwrap().clone()
    }
}

impl CounterFn for Series {
    fn increment(&self, v: u64) {
        self.push(v as f64);
    }
    fn absolute(&self, _: u64) {
        panic!("the elector never sets a counter");
    }
}

impl GaugeFn for Series {
    fn increment(&self, _: f64) {
        panic!("the elector only sets its gauge");
    }
    fn decrement(&self, _: f64) {
        panic!("the elector only sets its gauge");
    }
    fn set(&self, v: f64) {
        self.push(v);
    }
}

impl HistogramFn for Series {
    fn record(&self, v: f64) {
        self.push(v);
    }
}

/// Series by `name{label="value",...}`, labels in the order given, and the
/// units described.
#[derive(Default)]
struct Recorder {
    series: Mutex<BTreeMap<String, Arc<Series>>>,
    units: Mutex<BTreeMap<String, Option<Unit>>>,
}

impl Recorder {
    fn register(&self, key: &Key) -> Arc<Series> {
        let labels: Vec<String> = key.labels().map(|l| format!("{}={:?}", l.key(), l.value())).collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        Arc::clone(self.series.lock().unwrap().entry(name).or_default())
    }

    /// The values of series `name` (must exist).
    fn get(&self, name: &str) -> Vec<f64> {
        let series = self.series.lock().unwrap();
        let names: Vec<&String> = series.keys().collect();
        series.get(name).unwrap_or_else(|| panic!("no series {name}; have {names:#?}")).values()
    }

    fn sum(&self, name: &str) -> u64 {
        self.get(name).iter().sum::<f64>() as u64
    }
}

impl metrics::Recorder for Recorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.units.lock().unwrap().insert(key.as_str().to_owned(), unit);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.units.lock().unwrap().insert(key.as_str().to_owned(), unit);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.units.lock().unwrap().insert(key.as_str().to_owned(), unit);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.register(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.register(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.register(key))
    }
}

fn start(rec: &Recorder, store: &MemStore, name: &str) -> Elector {
    let config = Config::new(store.clone(), name).identity("node-1").timing(timing());
    metrics::with_local_recorder(rec, || Elector::start(config)).unwrap()
}

/// After shutdown, every counter equals its `Status` figure.
fn same_as_status(rec: &Recorder, st: &Status) {
    let e = format!("election={:?}", st.name);
    let c = |name: &str, label: &str| {
        let sep = if label.is_empty() { "" } else { "," };
        rec.sum(&format!("leaderelection_{name}{{{e}{sep}{label}}}"))
    };
    assert_eq!(c("terms_started_total", ""), st.terms_started);
    let t = &st.terms_ended;
    for (reason, n) in [
        ("resigned", t.resigned),
        ("lost", t.lost),
        ("expired", t.expired),
        ("fatal", t.fatal),
        ("shutdown", t.shutdown),
    ] {
        assert_eq!(c("terms_ended_total", &format!("reason={reason:?}")), n, "{reason}");
    }
    assert_eq!(c("renewals_total", "outcome=\"ok\""), st.renewals_ok);
    assert_eq!(c("renewals_total", "outcome=\"failed\""), st.renewals_failed);
    assert_eq!(c("store_calls_abandoned_total", ""), st.calls_abandoned);
}

#[test]
fn the_leader_gauge_goes_to_one_and_back_and_every_series_has_its_name_labels_and_unit() {
    let rec = Recorder::default();
    let store = MemStore::new();
    let e = start(&rec, &store, "metered");
    let series: Vec<String> = rec.series.lock().unwrap().keys().cloned().collect();
    let el = "election=\"metered\"";
    let mut want = vec![
        format!("leaderelection_leader{{{el}}}"),
        format!("leaderelection_terms_started_total{{{el}}}"),
        format!("leaderelection_store_calls_abandoned_total{{{el}}}"),
    ];
    for r in ["resigned", "lost", "expired", "fatal", "shutdown"] {
        want.push(format!("leaderelection_terms_ended_total{{{el},reason=\"{r}\"}}"));
    }
    for o in ["ok", "failed"] {
        want.push(format!("leaderelection_renewals_total{{{el},outcome=\"{o}\"}}"));
    }
    for k in ["retryable", "fatal", "lease_lost"] {
        want.push(format!("leaderelection_store_errors_total{{{el},kind=\"{k}\"}}"));
    }
    for op in ["inspect", "acquire", "renew", "release"] {
        want.push(format!("leaderelection_store_call_duration_seconds{{{el},op=\"{op}\"}}"));
    }
    want.sort();
    assert_eq!(series, want, "registered at start, every label value up front");
    let units = rec.units.lock().unwrap().clone();
    assert_eq!(units.len(), 7, "{units:?}");
    assert_eq!(units["leaderelection_store_call_duration_seconds"], Some(Unit::Seconds));

    let gauge = format!("leaderelection_leader{{{el}}}");
    let guard = lead(&e);
    assert_eq!(rec.get(&gauge), [0.0, 1.0], "0 at start, 1 once leading");
    until(&e, "three renewals", |s| s.renewals_ok >= 3);
    guard.resign().unwrap();
    assert_eq!(rec.get(&gauge), [0.0, 1.0, 0.0]);
    let second = lead(&e);
    assert_eq!(rec.get(&gauge), [0.0, 1.0, 0.0, 1.0]);
    e.shutdown().unwrap();
    assert_eq!(rec.get(&gauge), [0.0, 1.0, 0.0, 1.0, 0.0]);
    drop(second);

    let st = e.status();
    same_as_status(&rec, &st);
    assert_eq!((st.terms_ended.resigned, st.terms_ended.shutdown, st.terms_started), (1, 1, 2));
    let h = |op: &str| rec.get(&format!("leaderelection_store_call_duration_seconds{{{el},op=\"{op}\"}}"));
    let renews = h("renew");
    assert!(renews.len() as u64 >= st.renewals_ok && !renews.is_empty(), "{renews:?}");
    assert!(renews.iter().all(|s| (0.0..0.3).contains(s)), "seconds, under the timeout: {renews:?}");
    assert_eq!(h("acquire").len(), 2, "one acquire per term");
    assert_eq!(h("release").len(), 2, "the resignation's and the shutdown's");
    assert!(!h("inspect").is_empty());
    let errors = ["retryable", "fatal", "lease_lost"]
        .map(|k| rec.sum(&format!("leaderelection_store_errors_total{{{el},kind=\"{k}\"}}")));
    assert_eq!(errors, [0, 0, 0]);
}

/// `e` leads a term, `fault` breaks the store, and the term ends: waits
/// until `e`'s status counts the end as `how` says (`counted`).
fn a_term_ends(e: &Elector, fault: impl FnOnce(), how: &str, counted: impl Fn(&Status) -> bool) {
    let guard = lead(e);
    fault();
    term_ends(&guard);
    drop(guard);
    until(e, how, counted);
}

#[test]
fn failures_are_counted_by_kind_and_each_early_end_by_its_reason() {
    let rec = Recorder::default();
    let store = MemStore::new();
    let e = start(&rec, &store, "faulty");
    let errors = |k: &str| rec.sum(&format!("leaderelection_store_errors_total{{election=\"faulty\",kind=\"{k}\"}}"));

    // Retryable failures until the deadline: expired.
    a_term_ends(&e, || store.set_failing(Some(ErrorKind::Retryable)), "expired", |s| s.terms_ended.expired == 1);
    assert!(errors("retryable") >= 2);
    store.set_failing(None);

    // The row disappears: lost.
    a_term_ends(&e, || assert!(store.delete_row("faulty")), "lost", |s| s.terms_ended.lost == 1);
    assert_eq!(errors("lease_lost"), 1);

    // The store hangs: abandoned calls, expired.
    a_term_ends(&e, || store.pause(), "expired again", |s| s.terms_ended.expired == 2 && s.calls_abandoned >= 2);
    store.resume();

    // A fatal error: fatal.
    a_term_ends(&e, || store.set_failing(Some(ErrorKind::Fatal)), "fatal", |s| s.terms_ended.fatal == 1);
    assert!(errors("fatal") >= 1);
    e.shutdown_without_release();

    let st = e.status();
    assert_eq!((st.terms_started, st.terms_ended.total()), (4, 4), "{st}");
    assert!(st.renewals_failed >= 5, "{st}");
    same_as_status(&rec, &st);
    let gauge = rec.get("leaderelection_leader{election=\"faulty\"}");
    assert_eq!(gauge, [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]);
}

/// A group exports figures of its own, labelled with the group's name, and
/// no series per election (thousands of elections would each register a
/// dozen).
#[test]
fn a_group_exports_its_own_figures_and_none_per_election() {
    use leaderelection::{Group, GroupConfig};
    let rec = Recorder::default();
    let store = MemStore::new();
    let config =
        GroupConfig::new(Config::new(store.clone(), "shards").identity("node-1").timing(timing())).fair_share(true);
    let group = metrics::with_local_recorder(&rec, || Group::start(config)).unwrap();
    let shards: Vec<_> = (0..20).map(|i| group.join(&format!("shard-{i}")).unwrap()).collect();
    let g = "group=\"shards\"";
    let last = |name: &str| rec.get(&format!("{name}{{{g}}}")).last().copied();
    assert!(threaded::eventually(Duration::from_secs(5), || last("leaderelection_group_leading") == Some(20.0)));
    assert_eq!(last("leaderelection_group_elections"), Some(20.0));
    assert_eq!(last("leaderelection_group_live_members"), Some(1.0));
    assert_eq!(last("leaderelection_group_share"), Some(20.0));
    assert!(threaded::eventually(Duration::from_secs(5), || {
        rec.sum(&format!("leaderelection_group_calls_total{{{g},op=\"renew\",outcome=\"ok\"}}")) >= 2
    }));
    assert!(rec.sum(&format!("leaderelection_group_calls_total{{{g},op=\"heartbeat\",outcome=\"ok\"}}")) >= 1);
    let renew_times = rec.get(&format!("leaderelection_group_call_duration_seconds{{{g},op=\"renew\"}}"));
    assert!(!renew_times.is_empty() && renew_times.iter().all(|s| *s >= 0.0 && *s < 1.0), "{renew_times:?}");
    group.shutdown().unwrap();
    assert_eq!(rec.sum(&format!("leaderelection_group_calls_total{{{g},op=\"leave\",outcome=\"ok\"}}")), 1);
    assert!(rec.sum(&format!("leaderelection_group_calls_total{{{g},op=\"release\",outcome=\"ok\"}}")) >= 1);
    let series: Vec<String> = rec.series.lock().unwrap().keys().cloned().collect();
    assert!(series.iter().all(|s| s.starts_with("leaderelection_group_")), "per-election series: {series:#?}");
    drop(shards);
}

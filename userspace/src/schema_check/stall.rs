//! The detector's record, `stall`.

use crate::host::clock::Clock;
use crate::output::JsonWriter;
use crate::stall::Thresholds;

/// What the detector writes about an eventful interval (every kind opens),
/// and the same episodes closed at the end of the run.
pub(super) fn stall(w: &mut JsonWriter) {
    let now = Clock::now_rfc3339;
    let mut detector = crate::stall::Detector::new(Thresholds::default(), &now());
    let interval = crate::stall::fixtures::typed(&crate::stall::fixtures::eventful_interval());
    let opened = detector.interval(interval, &now(), 1000.0);
    assert_eq!(opened.len(), 5, "{opened:?}");
    for stall in opened.iter().chain(&detector.finish()) {
        w.emit(&now(), stall).unwrap();
    }
}

//! The SQL Server requests section of the terminal report: per instance what
//! the clients waited for, its split, and the slowest requests.

use std::fmt::Write as _;

use super::{section, table, wrap};
use crate::report::view::{TOTAL_MEANS, View};

pub(super) fn requests(o: &mut String, v: &View, width: usize) {
    if v.requests.is_empty() {
        return;
    }
    section(o, "SQL SERVER REQUESTS", width);
    for r in &v.requests {
        let _ = writeln!(o, "  {}: {}", r.instance, r.requests);
        let mut rows = vec![vec![
            String::new(),
            "p50".to_string(),
            "p90".into(),
            "p99".into(),
            "max".into(),
            "mean".into(),
        ]];
        for (name, s) in [
            ("total", &r.total),
            ("server", &r.server),
            ("delivery", &r.delivery),
        ] {
            rows.push(vec![
                name.to_string(),
                s.p50.clone(),
                s.p90.clone(),
                s.p99.clone(),
                s.max.clone(),
                s.mean.clone(),
            ]);
        }
        o.push_str(&table(&rows, &[false, true, true, true, true, true], 4));
        o.push_str(&wrap(&r.split, width, "    ", "    "));
        o.push_str(&wrap(&r.slow, width, "    ", "    "));
        for w in r.without_spid.iter().chain(&r.mars) {
            o.push_str(&wrap(w, width, "    ", "    "));
        }
        if !r.slowest.is_empty() {
            let _ = writeln!(o, "    slowest:");
            for s in &r.slowest {
                o.push_str(&wrap(s, width, "      ", "        "));
            }
        }
    }
    o.push_str(&wrap(
        &format!("(total: {TOTAL_MEANS})"),
        width,
        "  ",
        "   ",
    ));
}

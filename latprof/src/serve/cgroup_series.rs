//! The cgroup series of `serve` (`latprof_cgroup_*{cgroup}`): which cgroups get a series of
//! their own (at most `--max-cgroups`, `other` among them), their cumulative numbers, their
//! labels as names are found, and removed cgroups' series freed after a grace period
//! (`retire`).

use std::collections::{HashMap, HashSet};

use super::retire::Retire;
use crate::collect::Snapshot;

/// The series label for everything past `--max-series` (and past `--max-cgroups` here).
pub const OTHER: &str = "other";

/// The default of `--max-cgroups`.
pub const MAX_CGROUPS: usize = 30;

/// The cgroups seen, their series and numbers.
#[derive(Debug)]
pub struct CgroupSeries {
    /// At most this many cgroup series, `cgroup="other"` among them.
    max: usize,
    /// Cumulative (count, ns) per cgroup id, never decreasing; bounded by the kernel's
    /// per-cgroup table and the live tasks.
    totals: HashMap<u64, (u64, u64)>,
    /// Each cgroup id seen and its label, or `None` where it was folded into "other"; a
    /// cgroup stays in (or out) for the whole run.
    label: HashMap<u64, Option<String>>,
    /// Ids with a label of their own whose path was unknown when last looked at (their label
    /// is `cgroup ID` until the path is found).
    unnamed: HashSet<u64>,
    /// The labels in the order they were first given (the series' order).
    order: Vec<String>,
    /// Cgroups folded into "other".
    folded: u64,
    /// Removed cgroups' series freed after a grace period (`retire`).
    retire: Retire,
    /// What the retired cgroups folded into "other" had counted: "other" never goes back.
    other_retired: (u64, u64),
    /// The full container id of each label that names a container (a series of its own).
    container_ids: std::collections::BTreeMap<String, String>,
}

impl Default for CgroupSeries {
    fn default() -> Self {
        Self {
            max: MAX_CGROUPS,
            totals: HashMap::new(),
            label: HashMap::new(),
            unnamed: HashSet::new(),
            order: Vec::new(),
            folded: 0,
            retire: Retire::new(std::time::Duration::from_secs(1)),
            other_retired: (0, 0),
            container_ids: std::collections::BTreeMap::new(),
        }
    }
}

impl CgroupSeries {
    /// At most `n` series (at least 2: one and "other").
    pub fn set_max(&mut self, n: usize) {
        self.max = n.max(2);
    }

    /// Reads come every `interval` (the grace period is counted in reads).
    pub fn set_interval(&mut self, interval: std::time::Duration) {
        self.retire = Retire::new(interval);
    }

    /// Cgroups folded into "other" so far.
    #[must_use]
    pub fn folded(&self) -> u64 {
        self.folded
    }

    /// The full container id of each label that names a container.
    #[must_use]
    pub fn container_ids(&self) -> &std::collections::BTreeMap<String, String> {
        &self.container_ids
    }

    /// A cgroup's label: its readable name, or `cgroup ID` while its path is unknown; never
    /// the reserved "other" (a cgroup named so is labelled by its path).
    fn cgroup_label_of(snap: &Snapshot, id: u64) -> String {
        let name = crate::model::cgroup_name(snap, id);
        if name != OTHER {
            return name;
        }
        snap.cgroup_paths
            .get(&id)
            .and_then(|p| p.path.clone())
            .filter(|p| p != OTHER)
            .unwrap_or_else(|| format!("cgroup {id}"))
    }

    /// The cgroup series: cumulative numbers per label, "other" last where any cgroup was
    /// folded.
    ///
    /// Admission: each read, the cgroups not seen before are taken largest (by time) first;
    /// one whose label is already a series joins it, any other gets a series of its own
    /// while fewer than `--max-cgroups` - 1 exist, else it is folded into "other" (and
    /// counted). A cgroup stays where it was put for the whole run, so a counter never moves
    /// between its series and "other". Cgroups of the same name (`/a/inner` and `/b/inner`)
    /// share a series: a label is never repeated. A cgroup whose path was unknown when it
    /// came (`cgroup ID`) takes its name once its path is found.
    pub fn read(&mut self, snap: &Snapshot) -> Vec<(String, u64, u64)> {
        let mut now: HashMap<u64, (u64, u64)> = HashMap::new();
        let mut present = HashSet::new();
        for (key, rec) in snap.cgroup_records() {
            present.insert(key.cgroup);
            if self.retire.is_retired(key.cgroup) {
                continue;
            }
            let e = now.entry(key.cgroup).or_default();
            e.0 += rec.count;
            e.1 += rec.total_ns;
        }
        // Names found since: the first frame of a label, the path, may come later.
        let found: Vec<u64> = self
            .unnamed
            .iter()
            .copied()
            .filter(|id| snap.cgroup_paths.get(id).is_some_and(|p| p.path.is_some()))
            .collect();
        for id in found {
            self.unnamed.remove(&id);
            let label = Self::cgroup_label_of(snap, id);
            self.note_container(snap, id, &label);
            let old = self.label.insert(id, Some(label.clone())).flatten();
            // `cgroup ID` was this cgroup's alone: its name takes its place (or, where the
            // name is a series already, its place goes).
            let at = old.and_then(|o| self.order.iter().position(|l| *l == o));
            match (at, self.order.contains(&label)) {
                (Some(i), false) => self.order[i] = label,
                (Some(i), true) => {
                    self.order.remove(i);
                }
                (None, false) => self.order.push(label),
                (None, true) => {}
            }
        }
        for (&id, &(count, ns)) in &now {
            let t = self.totals.entry(id).or_default();
            *t = (t.0.max(count), t.1.max(ns));
        }
        // Removed cgroups' places freed first: a new one may take them. A series that a new
        // cgroup joins now (the same name: a timer's unit run again) is not freed: its counter
        // would start again from the new one's numbers.
        let incoming: HashSet<String> = now
            .keys()
            .filter(|id| !self.label.contains_key(id) && !self.retire.is_retired(**id))
            .map(|&id| Self::cgroup_label_of(snap, id))
            .collect();
        self.retire_removed(snap, &present, &incoming);
        let mut new: Vec<(u64, u64)> = now
            .iter()
            .filter(|(id, _)| !self.label.contains_key(id) && !self.retire.is_retired(**id))
            .map(|(id, (_, ns))| (*id, *ns))
            .collect();
        new.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        for (id, _) in new {
            let label = Self::cgroup_label_of(snap, id);
            let known = self.order.contains(&label);
            let labelled = if known || self.order.len() + 1 < self.max {
                if !known {
                    self.order.push(label.clone());
                }
                self.note_container(snap, id, &label);
                if snap.cgroup_paths.get(&id).is_none_or(|p| p.path.is_none()) {
                    self.unnamed.insert(id);
                }
                Some(label)
            } else {
                self.folded += 1;
                None
            };
            self.label.insert(id, labelled);
        }
        let mut sums: HashMap<&str, (u64, u64)> = HashMap::new();
        if self.other_retired != (0, 0) {
            sums.insert(OTHER, self.other_retired);
        }
        for (id, (count, ns)) in &self.totals {
            let label = self
                .label
                .get(id)
                .and_then(Option::as_deref)
                .unwrap_or(OTHER);
            let s = sums.entry(label).or_default();
            s.0 += count;
            s.1 += ns;
        }
        let mut out: Vec<(String, u64, u64)> = self
            .order
            .iter()
            .filter_map(|l| sums.get(l.as_str()).map(|&(c, n)| (l.clone(), c, n)))
            .collect();
        if let Some(&(c, n)) = sums.get(OTHER) {
            out.push((OTHER.to_owned(), c, n));
        }
        out
    }

    /// Frees the series of removed cgroups that stayed quiet for the grace period
    /// (`retire`): their label, their numbers (those folded into "other" stay counted there),
    /// their place among `--max-cgroups`.
    fn retire_removed(
        &mut self,
        snap: &Snapshot,
        present: &HashSet<u64>,
        incoming: &HashSet<String>,
    ) {
        let removed = |id: &u64| snap.cgroup_paths.get(id).is_some_and(|p| p.removed);
        let mut series: HashMap<Option<&str>, Vec<u64>> = HashMap::new();
        for (id, label) in &self.label {
            // A folded cgroup is a group of its own; a series' cgroups go together.
            let key = label.as_deref();
            if key.is_none() && !removed(id) {
                continue;
            }
            series.entry(key).or_default().push(*id);
        }
        let mut groups: Vec<(Option<String>, Vec<u64>)> = Vec::new();
        for (label, ids) in series {
            match label {
                Some(l) => groups.push((Some(l.to_owned()), ids)),
                None => groups.extend(ids.into_iter().map(|id| (None, vec![id]))),
            }
        }
        groups.retain(|(label, _)| label.as_ref().is_none_or(|l| !incoming.contains(l)));
        let watch: Vec<Vec<super::retire::Member>> = groups
            .iter()
            .map(|(_, ids)| {
                ids.iter()
                    .map(|id| {
                        let totals = self.totals.get(id).copied().unwrap_or_default();
                        (*id, removed(id), totals)
                    })
                    .collect()
            })
            .collect();
        for i in self.retire.read(&watch, present) {
            let (label, ids) = &groups[i];
            for id in ids {
                let totals = self.totals.remove(id).unwrap_or_default();
                if label.is_none() {
                    self.other_retired.0 += totals.0;
                    self.other_retired.1 += totals.1;
                }
                self.label.remove(id);
                self.unnamed.remove(id);
            }
            if let Some(label) = label {
                self.order.retain(|l| l != label);
                self.container_ids.remove(label);
            }
        }
    }

    /// Keeps the full id of the container cgroup `id` is, for its series' `label`.
    fn note_container(&mut self, snap: &Snapshot, id: u64, label: &str) {
        if let Some(full) = crate::model::container_id(snap, id) {
            self.container_ids.insert(label.to_owned(), full);
        }
    }
}

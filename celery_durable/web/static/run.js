// The run page: progress records appended as they arrive, the rest of the
// page (status, phases, steps, agents, waits) fetched again when the run
// changes, and older records fetched on demand.
"use strict";

(function () {
  const live = window.DurableLive;
  const root = document.getElementById("run-root");
  if (!root) return;
  const records = document.getElementById("records");
  let newest = Number(root.dataset.afterSeq) || 0;

  function when(iso) {
    const date = new Date(iso);
    return isNaN(date.getTime()) ? String(iso) : date.toISOString().slice(0, 19).replace("T", " ");
  }

  function part(tag, className, text) {
    const node = document.createElement(tag);
    node.className = className;
    node.textContent = text;
    return node;
  }

  // The same markup as run.html renders, built with textContent only.
  function recordNode(record, fresh) {
    const item = document.createElement("li");
    item.className = "record kind-" + String(record.kind).replace(/[^a-z]/g, "") + (fresh ? " fresh" : "");
    item.dataset.seq = String(record.seq);
    const at = part("time", "", when(record.at));
    at.dateTime = String(record.at);
    item.append(part("span", "seq", "#" + record.seq), at, part("span", "kind", record.kind),
                part("span", "message", record.message));
    return item;
  }

  function dropEmptyNote() {
    const empty = document.getElementById("no-records");
    if (empty) empty.remove();
  }

  function append(record) {
    if (record.seq <= newest) return;
    newest = record.seq;
    dropEmptyNote();
    const atBottom = records.scrollTop + records.clientHeight >= records.scrollHeight - 8;
    records.append(recordNode(record, true));
    if (atBottom) records.scrollTop = records.scrollHeight;
  }

  const refresh = live.serialized(async function () {
    const current = document.getElementById("run-live");
    const fresh = await live.fetchFragment(root.dataset.liveUrl, "run-live");
    // A section the operator may be typing in stays as it is while it still applies.
    const children = Array.from(fresh.children).map(function (node) {
      const old = node.id ? document.getElementById(node.id) : null;
      const keep = old && old.parentElement === current && node.dataset.preserve &&
        old.dataset.preserve === node.dataset.preserve;
      return keep ? old : node;
    });
    current.replaceChildren.apply(current, children);
  });

  const older = document.getElementById("older");
  if (older) {
    older.addEventListener("click", async function (event) {
      event.preventDefault();
      const url = root.dataset.progressUrl + "?limit=100&before_seq=" + encodeURIComponent(older.dataset.before);
      const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (!response.ok) {
        live.setState("error", "could not read older records");
        return;
      }
      const page = await response.json();
      records.prepend.apply(records, page.records.map(function (record) { return recordNode(record, false); }));
      if (page.has_more_older && page.records.length) {
        older.dataset.before = String(page.records[0].seq);
        older.href = "?before_seq=" + page.records[0].seq;
      } else {
        older.remove();
      }
    });
  }

  if (root.dataset.following !== "yes") return;
  live.connect(root.dataset.eventsUrl + "?after_seq=" + newest, {
    progress: append,
    run: function () { refresh(); },
    end: function (data, source) {
      source.close();
      refresh();
      live.setState("off", "settled: " + data.status);
    },
    problem: function (data) { live.setState("error", data.message); },
  });
})();

// The runs page: fetch the rows again whenever a run of the namespace changes,
// keeping the runs selected for a bulk action selected across each refresh.
"use strict";

(function () {
  const live = window.DurableLive;
  const first = document.getElementById("runs-live");
  if (!first) return;

  function boxes(root) {
    return Array.from(root.querySelectorAll('input[name="run_id"][form="bulk"]'));
  }

  function showCount() {
    const count = document.getElementById("bulk-count");
    const current = document.getElementById("runs-live");
    if (!count || !current) return;
    const picked = boxes(current).filter(function (box) { return box.checked; }).length;
    count.textContent = picked ? picked + " selected:" : "Select runs to act on several at once:";
    for (const id of ["bulk-cancel", "bulk-resume"]) {
      const button = document.getElementById(id);
      if (button) button.disabled = picked === 0;
    }
  }

  function wire(root) {
    const all = root.querySelector("#pick-all");
    if (all) {
      all.addEventListener("change", function () {
        for (const box of boxes(root)) box.checked = all.checked;
        showCount();
      });
    }
    for (const box of boxes(root)) box.addEventListener("change", showCount);
  }

  const refresh = live.serialized(async function () {
    const current = document.getElementById("runs-live");
    const picked = new Set(boxes(current).filter(function (box) { return box.checked; }).map(function (box) {
      return box.value;
    }));
    const fresh = await live.fetchFragment(current.dataset.rowsUrl, "runs-live");
    for (const box of boxes(fresh)) box.checked = picked.has(box.value);
    current.replaceWith(fresh);
    wire(fresh);
    showCount();
  });

  wire(first);
  showCount();
  let connections = 0;
  live.connect(first.dataset.eventsUrl, {
    // After a reconnection, changes made while disconnected went unannounced.
    ready: function () { if (connections++ > 0) refresh(); },
    runs: function () { refresh(); },
  });
})();

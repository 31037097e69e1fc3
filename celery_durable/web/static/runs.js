// The runs page: fetch the rows again whenever a run of the namespace changes.
"use strict";

(function () {
  const live = window.DurableLive;
  const first = document.getElementById("runs-live");
  if (!first) return;

  const refresh = live.serialized(async function () {
    const current = document.getElementById("runs-live");
    const fresh = await live.fetchFragment(current.dataset.rowsUrl, "runs-live");
    current.replaceWith(fresh);
  });

  let connections = 0;
  live.connect(first.dataset.eventsUrl, {
    // After a reconnection, changes made while disconnected went unannounced.
    ready: function () { if (connections++ > 0) refresh(); },
    runs: function () { refresh(); },
  });
})();

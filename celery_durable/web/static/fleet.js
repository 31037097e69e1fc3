// The fleet page: read the workers, queues and take-overs again every few seconds.
"use strict";

(function () {
  const live = window.DurableLive;
  const first = document.getElementById("fleet-live");
  if (!first) return;
  const every = Number(first.dataset.refreshMs) || 5000;

  const refresh = live.serialized(async function () {
    const current = document.getElementById("fleet-live");
    const fresh = await live.fetchFragment(current.dataset.url, "fleet-live");
    fresh.dataset.refreshMs = String(every);
    current.replaceWith(fresh);
    live.setState("on", "every " + Math.round(every / 1000) + " s");
  });

  live.setState("on", "every " + Math.round(every / 1000) + " s");
  window.setInterval(refresh, every);
})();
